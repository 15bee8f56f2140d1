"""The ``kvhit`` command line: the only package that imports click and rich.

:mod:`kvhit.cli.main` is the entry point; each command lives in its own module
(``check``, ``prove``, ``campaign`` for fuzz/gate/replay, ``matrix``, ``verify``) and
is imported only when run.
"""
