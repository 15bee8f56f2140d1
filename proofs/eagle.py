"""Theorem 7: eagle single drop, spiral, single pass (work in progress)."""
