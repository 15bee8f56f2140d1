"""Honest signals from targets (issue 31, items 2, 5 and 9): loading is not a call and
has its own limit; a target's prints never reach kvhit's stdout; an error says what
raised it and where."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import chdir
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from test_reliability import kvhit

from kvhit.cli.main import main
from kvhit.errors import TargetError
from kvhit.targets import registry
from kvhit.targets.registry import VLLM_HINT, BuiltIn
from kvhit.targets.runner import CallableRunner, CommandRunner, IsolatedRunner, captured
from kvhit.targets.target_spec import TargetSpec

HERE = Path(__file__).parent
CHATTY = "chatty_targets"
ONE_GROUP = {
    "groups": [{"kind": "full", "block_size": 1, "eagle": False}],
    "cached": [[True]],
    "max_length": 1,
    "num_tokens": 2,
    "alignment": 1,
}


def cli(*args: str, cwd: Path) -> Result:
    """The kvhit command line in this process, from ``cwd``."""
    with chdir(cwd):
        return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.fixture(autouse=True)
def fresh_modules(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """tests/ importable (here and in workers), and the target modules a test imports
    forgotten after it."""
    monkeypatch.syspath_prepend(str(HERE))
    monkeypatch.setenv("PYTHONPATH", str(HERE))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.startswith(("slow_", "raises_on_import", "returns_str")):
            del sys.modules[name]


def slow_module(folder: Path, seconds: float, lazy: bool = False) -> str:
    """A target module in ``folder`` that takes ``seconds`` to import (``lazy``: its
    function imports the slow part in its first call instead); its target name."""
    (folder / "slow_part.py").write_text(f"import time\n\ntime.sleep({seconds})\n")
    body = "    import slow_part  # noqa: F401\n" if lazy else ""
    head = "" if lazy else "import slow_part  # noqa: F401\n"
    (folder / "slow_target.py").write_text(
        f"{head}from kvhit.targets.registry import model_target\n\n\n"
        f"def lookup(query):\n{body}    return model_target(query)\n"
    )
    return "slow_target:lookup"


# Item 2: loading is not answering a query.

HOW = [("--jobs", "1"), ("--jobs", "2"), ("--isolate", "--jobs", "1")]


@pytest.mark.parametrize("how", HOW, ids=["in-process", "two-jobs", "isolated"])
def test_a_target_slower_to_import_than_a_call_is_no_timeout(
    how: tuple[str, ...], tmp_path: Path
) -> None:
    target = slow_module(tmp_path, 1.0)
    args = ("--target", target, "--timeout", "0.3", "--cases", "100", "--json", *how)
    run = cli("fuzz", *args, cwd=tmp_path)
    assert run.exit_code == 0, run.stderr
    assert set(json.loads(run.stdout)["counts"]) == {"ok"}


@pytest.mark.parametrize("how", HOW, ids=["in-process", "two-jobs", "isolated"])
def test_a_load_past_the_load_limit_is_bad_input_naming_the_limit(
    how: tuple[str, ...], tmp_path: Path
) -> None:
    target = slow_module(tmp_path, 30.0)
    args = ("gate", "--target", target, "--load-timeout", "0.5", "--json", *how)
    run = cli(*args, cwd=tmp_path)
    assert run.exit_code == 2 and run.stdout == ""
    errors = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
    where = " in a worker" if "--isolate" in how else ""
    assert errors == [
        f"error: target {target!r}: loading it{where} took longer than the load limit of "
        "0.5 s (--load-timeout)"
    ]


def test_a_program_slow_to_start_gets_the_load_limit_for_its_first_answer(
    tmp_path: Path,
) -> None:
    """A program that starts for longer than a call (here 5.5 s, past the 5 s every
    program used to get) answers its first query within the load limit."""
    program = tmp_path / "slow_program.py"
    program.write_text(
        f"import time\n\ntime.sleep(5.5)\nexec(open({str(HERE / 'cmd_target.py')!r}).read())\n"
    )
    runner = CommandRunner([sys.executable, str(program), "good"], 0.5)
    try:
        reply = runner(ONE_GROUP)
    finally:
        runner.close()
    assert reply.status == "answer", reply.detail


def test_a_program_that_never_answers_says_it_had_the_load_limit_too() -> None:
    runner = CommandRunner([sys.executable, "-c", "import time; time.sleep(60)"], 0.2, 0.3)
    try:
        reply = runner(ONE_GROUP)
    finally:
        runner.close(kill=True)
    assert reply.status == "timeout"
    assert reply.detail == (
        "no answer within 0.2 s (and 0.3 s for its start, --load-timeout); program restarted"
    )


def test_a_built_in_preloads_what_its_first_call_would_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first call of a built-in whose lookup imports a slow module lazily (as
    vllm-undocumented imports vLLM) is timed as a call only: loading did the import."""
    slow_module(tmp_path, 1.0, lazy=True)
    monkeypatch.syspath_prepend(str(tmp_path))
    lazy = BuiltIn("slow_target:lookup", preload="slow_part:time")
    monkeypatch.setitem(registry.BUILTINS, "lazy", lazy)
    runner = TargetSpec("lazy", timeout=0.3).open()
    assert runner(ONE_GROUP).status == "answer"
    assert runner.load_seconds is not None and runner.load_seconds >= 1.0


def test_vllm_undocumented_imports_vllm_when_loaded_not_in_its_first_call(
    tmp_path: Path,
) -> None:
    """Without vLLM, the target cannot be loaded (exit 2, the install hint), where its
    first query used to crash; with vLLM, loading imports the adapter."""
    if importlib.util.find_spec("vllm") is None:
        run = cli("gate", "--target", "vllm-undocumented", "--jobs", "1", cwd=tmp_path)
        assert run.exit_code == 2 and VLLM_HINT in run.stderr, run.stderr
    else:
        registry.load("vllm-undocumented")
        assert "kvhit.engines.vllm.target" in sys.modules


# Item 5: a target's prints never reach kvhit's stdout.


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_printing_target_leaves_one_json_document_on_stdout(jobs: str, tmp_path: Path) -> None:
    args = ("--target", f"{CHATTY}:chatty", "--json", "--jobs", jobs, "--seconds", "0.1")
    run = kvhit("gate", *args, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)  # the whole of stdout is one JSON document
    assert report["counts"]["ok"] > 0 and "debug" not in run.stdout + run.stderr
    assert sum(report["counts"].values()) > 500  # the exhaustive and corpus phases at least


def test_a_printing_target_leaves_the_report_alone(tmp_path: Path) -> None:
    run = cli("fuzz", "--target", f"{CHATTY}:chatty", "--cases", "300", "--jobs", "1", cwd=tmp_path)
    assert run.exit_code == 0, run.stderr
    assert run.stdout.splitlines()[-1] == "no disagreement found"
    assert "loading the engine" not in run.stdout and "debug" not in run.stdout


@pytest.mark.parametrize("isolate", [(), ("--isolate",)], ids=["in-process", "isolated"])
def test_what_a_crashing_target_printed_ends_its_reason(
    isolate: tuple[str, ...], tmp_path: Path
) -> None:
    args = ("--target", f"{CHATTY}:boom", "--cases", "300", "--json", "--jobs", "1", *isolate)
    run = cli("fuzz", *args, cwd=tmp_path)
    assert run.exit_code == 1, run.stderr
    [found] = json.loads(run.stdout)["disagreements"]
    assert found["class"] == "crash"
    assert found["reason"].startswith("RuntimeError: no state for block -1 (raised at ")
    assert found["reason"].endswith(
        "; it printed on stdout, ending with:\nboom: about to look up mamba"
    )


def test_native_prints_of_an_isolated_target_stay_off_stdout(tmp_path: Path) -> None:
    args = ("--target", f"{CHATTY}:native_chatty", "--isolate", "--cases", "200", "--json")
    run = kvhit("fuzz", *args, "--jobs", "1", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["cases"] == 200


def test_a_program_printing_debug_lines_is_told_where_they_go(tmp_path: Path) -> None:
    program = tmp_path / "debug_program.py"
    program.write_text(
        "import sys\n\nfor line in sys.stdin:\n    print('looking up', flush=True)\n"
    )
    runner = CommandRunner([sys.executable, str(program)], 10.0)
    try:
        reply = runner(ONE_GROUP)
    finally:
        runner.close()
    assert reply.status == "bad_return"
    assert reply.detail == (
        "not JSON: 'looking up' (stdout carries only answers; print anything else to stderr)"
    )


def test_output_is_kept_only_from_the_thread_running_the_target(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another thread's writes (kvhit's progress display) go on to the real stdout."""
    real = io.StringIO()
    monkeypatch.setattr(sys, "stdout", real)
    with captured() as out:
        print("from the target")
        other = threading.Thread(target=print, args=("from the display",))
        other.start()
        other.join()
    assert sys.stdout is real
    assert out.kept == "from the target\n" and real.getvalue() == "from the display\n"


class Terminal(io.StringIO):
    """A stdout that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_the_display_still_sees_its_terminal_while_a_target_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The progress display draws only on a terminal, and asks stdout while the target
    runs: the stand-in answers for the terminal."""
    monkeypatch.setattr(sys, "stdout", Terminal())
    with captured():
        assert sys.stdout.isatty()


# Item 9: errors that say what raised them and where.


def test_a_memory_error_says_what_ran_out_and_on_what() -> None:
    runner = CallableRunner(registry.load(f"{CHATTY}:allocates"), 10.0)
    rows = {"max_length": 3000, "cached": [[True] * 3000], "num_tokens": 3001}
    reply = runner({**ONE_GROUP, **rows})
    assert reply.status == "crash"
    assert "MemoryError (raised at " in reply.detail and "chatty_targets.py:" in reply.detail
    assert reply.detail.endswith(
        ': out of memory running `history = bytearray(query["max_length"] << 50)` '
        "on a query of 1 group, 3,000 blocks in all, M=3,000"
    )


@pytest.mark.parametrize("error", ["ValueError", "RuntimeError"])
def test_a_module_that_raises_on_import_is_named_with_its_file_and_line(
    error: str, tmp_path: Path
) -> None:
    (tmp_path / "raises_on_import.py").write_text(
        f"import json\n\nSETTINGS = {{}}\nraise {error}('no settings found')\n\n\n"
        "def f(q):\n    return 0\n"
    )
    run = cli("gate", "--target", "raises_on_import:f", "--jobs", "1", cwd=tmp_path)
    assert run.exit_code == 2
    assert run.stderr.splitlines()[-1] == (
        f"error: target 'raises_on_import:f': importing it failed: {error}: no settings "
        "found (raised at raises_on_import.py:4)"
    )


def test_a_module_written_as_a_file_is_told_to_drop_the_py(tmp_path: Path) -> None:
    (tmp_path / "returns_str.py").write_text("def f(q):\n    return '1'\n")
    run = cli("gate", "--target", "returns_str.py:f", "--jobs", "1", cwd=tmp_path)
    assert run.exit_code == 2
    assert run.stderr.splitlines()[-1].endswith(
        "; name the module, not its file: --target returns_str:f"
    )


def test_a_module_given_as_a_path_is_told_its_module_name() -> None:
    with pytest.raises(
        TargetError, match=r"is a path; name the module, not its file: --target pkg.mod:f$"
    ):
        registry.load("./pkg/mod.py:f")


def test_ctrl_c_while_a_worker_loads_ends_the_worker(tmp_path: Path) -> None:
    """The worker writes its pid as it starts loading; Ctrl-C then reaches kvhit,
    which must not leave the worker behind."""
    pid_file = tmp_path / "worker.pid"
    (tmp_path / "pid_target.py").write_text(
        "import os\nimport time\n\n"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)\n\n\n"
        "def lookup(query):\n    return None\n"
    )

    def ctrl_c_once_loading() -> None:
        while not pid_file.exists() or not pid_file.read_text():
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=ctrl_c_once_loading, daemon=True).start()
    with chdir(tmp_path), pytest.raises(KeyboardInterrupt):
        IsolatedRunner("pid_target:lookup", timeout=5.0, load_timeout=120.0)
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)


@pytest.mark.parametrize("how", HOW, ids=["in-process", "two-jobs", "isolated"])
def test_the_report_says_how_long_loading_took(how: tuple[str, ...], tmp_path: Path) -> None:
    target = slow_module(tmp_path, 1.5)
    args = ("--target", target, "--cases", "20", *how)
    run = cli("fuzz", *args, "--json", cwd=tmp_path)
    assert run.exit_code == 0 and json.loads(run.stdout)["load_seconds"] >= 1.5
    for name in ("slow_target", "slow_part"):  # imported again by the next run
        sys.modules.pop(name, None)
    run = cli("fuzz", *args, cwd=tmp_path)
    assert re.search(r"\(loading the target took \d+\.\d s\)", run.stdout), run.stdout
