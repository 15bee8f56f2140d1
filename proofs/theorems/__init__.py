"""The theorem modules: each registers its THEOREMS (docs/design.md §3)."""
