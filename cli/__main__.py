"""``python -m kvhit.cli``: the same as the ``kvhit`` command."""

from kvhit.cli.main import main

main()
