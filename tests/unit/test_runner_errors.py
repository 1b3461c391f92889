"""Errors of the worker processes of `runner="processes"`: a user's exception, a process
that dies (also halfway through sending a chunk), a script without a main guard, a full
temporary folder, a killed run's chain file; each reaches the caller named, with what to
check."""

from __future__ import annotations

import contextlib
import json
import multiprocessing.connection
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import thread_stack
from zephon_torch import ConfigError, DataError, Pipeline
from zephon_torch._token_stage import doc_ops
from zephon_torch.errors import WorkerTraceback
from zephon_torch.io import Dataset
from zephon_torch.ops._doc_chain import DocChain
from zephon_torch.ops._runner import Runner
from zephon_torch.ops.fetch import FetchOp
from zephon_torch.work import StaticMixtureWorkSource
from zephon_torch.work.pointers import PointerSpan


def test_a_data_error_in_a_worker_process_reaches_the_caller_intact(
    tmp_path: Path, tokenizer: Any
) -> None:
    shard = tmp_path / "p.jsonl"
    shard.write_text(json.dumps({"text": "fine"}) + "\n" + "not json\n")
    source = StaticMixtureWorkSource([Dataset.from_path("web", shard)], seed=0)
    pipeline = (
        Pipeline(source)
        .tokenize(tokenizer=tokenizer, runner="processes", parallelism=1)
        .pack_flat(8)
        .batch(1)
    )
    with pytest.raises(DataError) as info:
        list(pipeline)
    assert (info.value.dataset, info.value.row) == ("web", 1)


class RowRefused(ValueError):
    """A user's exception type, importable by spawned workers."""


def refuse_row_five(row: dict[str, Any]) -> dict[str, Any]:
    if row["n"] == 5:
        raise RowRefused(f"row {row['n']} is refused")
    return row


def exit_at_row_five(row: dict[str, Any]) -> dict[str, Any]:
    if row["n"] == 5:
        os._exit(3)  # the process dies, as one killed for memory does
    return row


def test_a_process_of_the_processes_runner_that_dies_is_named_with_what_to_check() -> None:
    data = Dataset.from_dict("d", {"ids": [[1, 2, 3]] * 8, "n": list(range(8))}, shard_size=4)
    recipe = Pipeline(StaticMixtureWorkSource([data], shuffle=False)).map(exit_at_row_five)
    pipeline = recipe.pretokenized("ids", runner="processes", parallelism=1).pack_flat(8)
    with pytest.raises(BrokenProcessPool) as caught:
        list(pipeline.batch(1))
    # how it ended, and no guess at memory: the message said "killed (out of memory?)" for any
    text = str(caught.value)
    assert "runner='processes' ended abruptly (exited with code 3): its code failed" in text
    assert "out of memory" not in text


def killed_while_sending(row: dict[str, Any]) -> dict[str, Any]:
    """At row 1, this worker process is killed halfway through sending its chunk back (the
    out-of-memory killer ends the largest process: often one sending a large chunk)."""
    if row["n"] == 1:
        send = multiprocessing.connection.Connection._send

        def send_half(self: Any, buf: bytes, *args: Any) -> None:
            if len(buf) > 16384:  # the chunk, sent after its length
                send(self, buf[: len(buf) // 2])
                os.kill(os.getpid(), signal.SIGKILL)
            send(self, buf, *args)

        multiprocessing.connection.Connection._send = send_half  # type: ignore[method-assign]
    return row


def test_a_process_killed_while_sending_its_chunk_breaks_the_pool_instead_of_hanging() -> None:
    """The pool's thread had read the chunk's length and waited for the rest for ever: the
    pipe's other writers (the parent itself, the other workers) kept it open, and the process
    that died was not looked at while it waited. Every reader then waited for ever."""
    data = Dataset.from_dict("d", {"ids": [list(range(9000))] * 4, "n": [0, 1, 2, 3]})
    source = StaticMixtureWorkSource([data], shuffle=False)
    recipe = Pipeline(source).map(killed_while_sending).pretokenized("ids", runner="processes")
    runner = Runner(
        DocChain(FetchOp(source.datasets), doc_ops(recipe)), parallelism=1, kind="processes"
    )
    layout = source.layouts[0]
    try:
        chunks = [
            runner.submit(0, layout.span(pass_index=0, lane=0, num_lanes=1, start=row, count=1))
            for row in range(4)
        ]
        assert len(chunks[0].result(timeout=60)) == 1
        for chunk in chunks[1:]:  # its chunk, and those queued after it, fail
            error = chunk.exception(timeout=60)
            assert isinstance(error, BrokenProcessPool), error
            said = "ended abruptly (killed by SIGKILL): it was killed (out of memory?)"
            assert said in str(error)
    finally:
        runner.close()


def _waits_on_a_pipe(pid: int) -> bool:
    """Whether process ``pid`` is blocked reading a pipe (its kernel wait channel)."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/wchan") as wchan:
        return "pipe" in wchan.read()
    return False


def _two_workers_and_eight_spans() -> tuple[Runner, list[PointerSpan]]:
    """A processes runner of two workers, and eight one-row spans of pre-tokenized rows."""
    data = Dataset.from_dict("d", {"ids": [[1, 2, 3]] * 8})
    source = StaticMixtureWorkSource([data], shuffle=False)
    recipe = Pipeline(source).pretokenized("ids", runner="processes")
    runner = Runner(
        DocChain(FetchOp(source.datasets), doc_ops(recipe)), parallelism=2, kind="processes"
    )
    layout = source.layouts[0]
    spans = [layout.span(pass_index=0, lane=0, num_lanes=1, start=r, count=1) for r in range(8)]
    return runner, spans


def _both_started(
    runner: Runner, spans: list[PointerSpan], executor: ProcessPoolExecutor
) -> tuple[list[Any], threading.Thread]:
    """Run ``spans``, which starts both workers; their processes and the pool's thread."""
    for chunk in [runner.submit(0, span) for span in spans]:
        chunk.result(timeout=60)
    processes = list(executor._processes.values())
    manager = executor._executor_manager_thread
    assert len(processes) == 2 and manager is not None
    return processes, manager


def test_a_pool_closed_after_an_idle_worker_died_ends_its_other_workers() -> None:
    """An idle worker waits for its next chunk holding the call queue's read lock, and the
    others wait for that lock. One killed there (out of memory) just before the runner closed,
    before the pool's thread saw it, left the pool to shut down as if nothing had happened:
    it sent each worker its stop and joined them, and a worker waiting for the dead one's lock
    never took it. The pool's thread waited for ever, and the interpreter, which joins it at
    exit, with it. Here the worker holding the lock is stopped until the pool joins it."""
    runner, spans = _two_workers_and_eight_spans()
    executor = runner._executor
    assert isinstance(executor, ProcessPoolExecutor)
    try:
        processes, manager = _both_started(runner, spans, executor)
        deadline = time.monotonic() + 60
        while not (reading := [p for p in processes if _waits_on_a_pipe(p.pid)]):
            if time.monotonic() > deadline:
                pytest.skip("no worker is seen waiting on the call queue's pipe (/proc/PID/wchan)")
            time.sleep(0.01)
        os.kill(reading[0].pid, signal.SIGSTOP)
    finally:
        runner.close()
    deadline = time.monotonic() + 60
    while "join_executor_internals" not in thread_stack(manager) and manager.is_alive():
        assert time.monotonic() < deadline, "the pool's thread did not go on to join its workers"
        time.sleep(0.01)
    os.kill(reading[0].pid, signal.SIGKILL)  # it dies holding the lock
    manager.join(60)
    assert not manager.is_alive()
    assert all(not process.is_alive() for process in processes)


def test_a_pool_broken_by_its_own_thread_ends_its_workers_that_ignore_sigterm() -> None:
    """Workers ignore SIGTERM (a scheduler's, sent to the whole job, is the parent's to act
    on), and the pool's own thread, finding a worker dead, ends the others with `terminate`
    and then joins them: it must end them by SIGKILL, or it waits for ever. The watch, which
    ends them itself, is stopped here so that the pool's thread sees the death alone."""
    runner, spans = _two_workers_and_eight_spans()
    executor, watch = runner._executor, runner._watch
    assert isinstance(executor, ProcessPoolExecutor) and watch is not None
    try:
        processes, manager = _both_started(runner, spans, executor)
        watch.stop()
        os.kill(processes[0].pid, signal.SIGKILL)
        manager.join(30)
        assert not manager.is_alive(), thread_stack(manager)
        assert not processes[1].is_alive()
    finally:
        runner.close()


_UNGUARDED = """
import functools

from zephon_torch import Pipeline
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource


def tag(row, big):
    return row


data = Dataset.from_dict("d", {"ids": [[1, 2, 3]] * 8})
recipe = Pipeline(StaticMixtureWorkSource([data], shuffle=False))
recipe = recipe.map(functools.partial(tag, big=b"x" * 300_000), name="tag")
pipeline = recipe.pretokenized("ids", runner="processes", parallelism=1).pack_flat(8).batch(1)
print(sum(1 for _ in pipeline))
"""


def test_a_script_without_a_main_guard_fails_with_the_advice_instead_of_hanging(
    tmp_path: Path,
) -> None:
    """Each spawned process imports the script again and fails starting its own pool. The
    chain (a map holding 300 kB here; a tokenizer is as large) went to it through a pipe the
    parent held open itself, so the parent waited for ever to write the rest."""
    script = tmp_path / "unguarded.py"
    script.write_text(_UNGUARDED)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 1
    assert "BrokenProcessPool" in done.stderr
    assert 'under `if __name__ == "__main__":`' in done.stderr


_FULL_TEMP = """
import functools, os, resource, signal, sys, tempfile

from zephon_torch import Pipeline
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource


def tag(row, big):
    return row


if __name__ == "__main__":
    tempfile.tempdir = sys.argv[1]
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails, as when full
    resource.setrlimit(resource.RLIMIT_FSIZE, (64_000, resource.RLIM_INFINITY))
    data = Dataset.from_dict("d", {"ids": [[1, 2, 3]] * 8})
    recipe = Pipeline(StaticMixtureWorkSource([data], shuffle=False))
    recipe = recipe.map(functools.partial(tag, big=b"x" * 300_000), name="tag")
    pipeline = recipe.pretokenized("ids", runner="processes", parallelism=1).pack_flat(8)
    for attempt in range(2):
        try:
            list(pipeline.batch(1))
        except Exception as error:
            print(type(error).__name__, error)
"""


def test_a_full_temporary_folder_is_named_and_left_as_it_was(tmp_path: Path) -> None:
    """The processes runner's chain file, cut short, was left behind at every iteration,
    and a bare OSError named neither the file nor the runner."""
    script, temp = tmp_path / "full.py", tmp_path / "temp"
    script.write_text(_FULL_TEMP)
    temp.mkdir()
    done = subprocess.run(
        [sys.executable, str(script), str(temp)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = done.stdout.splitlines()
    assert len(lines) == 2, done.stdout + done.stderr
    for line in lines:
        assert line.startswith("ConfigError runner='processes' cannot write its chain")
        assert str(temp) in line and "TMPDIR" in line
    assert list(temp.iterdir()) == []


_HELD_RUN = """
import sys, tempfile, time

from zephon_torch import Pipeline
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource

if __name__ == "__main__":
    tempfile.tempdir = sys.argv[1]
    data = Dataset.from_dict("d", {"ids": [[1, 2, 3]] * 8})
    recipe = Pipeline(StaticMixtureWorkSource([data], shuffle=False))
    pipeline = recipe.pretokenized("ids", runner="processes", parallelism=1).pack_flat(8)
    batches = iter(pipeline.batch(1))
    next(batches)
    print("running", flush=True)
    time.sleep(120)
"""


def test_a_chain_file_left_by_a_killed_process_is_removed_by_the_next_runner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process killed by SIGKILL (the out-of-memory killer) left its chain file (maps,
    filters, tokenizer: megabytes) in the temporary folder for ever, one per crash. The next
    runner removes it; a live runner's file stays."""
    import signal
    import tempfile

    from zephon_torch.ops._chain_file import release, write_chain

    script, temp = tmp_path / "held.py", tmp_path / "temp"
    script.write_text(_HELD_RUN)
    temp.mkdir()
    run = subprocess.Popen(
        [sys.executable, str(script), str(temp)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert run.stdout is not None and run.stdout.readline() == "running\n"
        assert len(list(temp.glob("zephon-chain-*.pickle"))) == 1
        workers = _children(run.pid)
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=30)
    assert len(list(temp.glob("zephon-chain-*.pickle"))) == 1  # left behind
    # its worker processes end too: orphaned, they waited for a task for ever
    deadline = time.monotonic() + 20
    while any(os.path.exists(f"/proc/{pid}") for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert workers and not [pid for pid in workers if os.path.exists(f"/proc/{pid}")]
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    path, lock = write_chain(b"chain")
    assert list(temp.iterdir()) == [Path(path)]  # the killed process's file is gone
    other, other_lock = write_chain(b"chain")
    assert sorted(temp.iterdir()) == sorted([Path(path), Path(other)])  # a live one stays
    release(path, lock)
    release(other, other_lock)
    assert list(temp.iterdir()) == []


def _children(parent: int) -> list[int]:
    """The processes whose parent is ``parent`` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{entry}/stat") as stat:
                if int(stat.read().rsplit(")", 1)[1].split()[1]) == parent:
                    found.append(int(entry))
    return found


def refusing_pipeline(runner: str) -> Pipeline:
    data = Dataset.from_dict("d", {"ids": [[1, 2, 3]] * 8, "n": list(range(8))}, shard_size=4)
    source = StaticMixtureWorkSource([data], shuffle=False)
    recipe = Pipeline(source).map(refuse_row_five)
    return recipe.pretokenized("ids", runner=runner, parallelism=1).pack_flat(8).batch(1)  # type: ignore[arg-type]


@pytest.mark.parametrize("runner", ["inline", "processes"])
def test_a_map_s_exception_is_the_cause_in_any_runner(runner: str) -> None:
    """The README's promise: the user's exception is the DataError's cause, its own type, also
    from a worker process; its frames come along as text (a WorkerTraceback below it)."""
    with pytest.raises(
        DataError, match=r"row 1: map .*refuse_row_five.* raised RowRefused"
    ) as caught:
        list(refusing_pipeline(runner))
    cause = caught.value.__cause__
    assert type(cause).__name__ == "RowRefused" and str(cause) == "row 5 is refused"
    if runner == "processes":
        frames = cause.__cause__
        assert isinstance(frames, WorkerTraceback)
        assert 'in refuse_row_five\n    raise RowRefused(f"row' in str(frames)


def test_runner_processes_inside_a_dataloader_worker_is_a_config_error() -> None:
    from zephon_torch.torch import DataLoader

    loader = DataLoader(refusing_pipeline("processes"), num_workers=1)
    with pytest.raises(ConfigError, match="runner='processes' cannot start its processes here"):
        list(loader)
