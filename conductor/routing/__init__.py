"""Messages and hops, never bytes: per-hop ids, pending replies, the chain router."""
