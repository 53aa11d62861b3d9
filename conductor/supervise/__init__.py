"""Process lifecycle, no JSON: spawn, stderr, graceful stop, no orphans."""
