"""Memory: token allocator, KV pool, request-to-token table."""
