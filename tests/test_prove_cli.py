"""Tests of `kvhit prove` (work in progress)."""
