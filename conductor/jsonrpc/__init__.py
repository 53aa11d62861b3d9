"""Sans-I/O JSON-RPC 2.0: frames, envelopes and error codes. No anyio here."""
