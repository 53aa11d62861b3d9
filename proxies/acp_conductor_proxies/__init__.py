"""Built-in proxies for acp-conductor."""
