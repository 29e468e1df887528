"""The tiers below device memory: the host tier (``host_tier``) and the durable KV store
(``kv_store`` and its ``store_*`` parts, joined to the memory above by ``store_tier``), and
conversation checkpoints pinned in the store (``checkpoints``)."""
