"""Moving Messages over byte pipes, our own stdio, or in memory."""
