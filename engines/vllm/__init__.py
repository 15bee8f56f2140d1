"""vLLM as a target: its coordinator (stateless), its KVCacheManager (stateful)."""
