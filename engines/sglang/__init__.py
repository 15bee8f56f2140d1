"""SGLang as a target: its radix caches (stateless), its UnifiedRadixCache (stateful)."""
