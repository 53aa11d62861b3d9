"""One JSON-RPC endpoint (ids, pending requests, cancellation) for every connection."""
