"""Device memory: the token allocator, the KV pool, the request-to-token table and the radix
cache of prefixes. Mechanism only; who gets memory is decided in ``engine.scheduler.memory``."""
