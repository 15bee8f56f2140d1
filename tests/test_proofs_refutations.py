"""Tests of the refuted theorems (work in progress)."""
