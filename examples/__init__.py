"""The seed example, made exact (DESIGN.md §1), as protocol query files."""
