"""The `kvhit prove` command (work in progress)."""
