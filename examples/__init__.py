"""The seed example, made exact (docs/design.md §1.5), as protocol query files."""
