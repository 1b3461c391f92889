"""The runners of per-document work (threads, processes, inline): what comes back from them,
the errors they give, and how they end."""

from __future__ import annotations

import multiprocessing.connection
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool, _RemoteTraceback
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import prose_documents
from tests.helpers import group_ended, interrupt_group, thread_stack
from zephon_torch import DataError, Pipeline
from zephon_torch._token_stage import doc_ops
from zephon_torch.io import Dataset
from zephon_torch.ops._doc_chain import DocChain
from zephon_torch.ops._runner import Runner, _broken
from zephon_torch.ops.fetch import FetchOp
from zephon_torch.work import StaticMixtureWorkSource, TokenEstimation

# module-level user functions: spawned worker processes import them from here


def tensor_payload(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "vec": torch.arange(16) + row["n"]}


def memoryview_payload(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "blob": memoryview(row["text"].encode())}


def not_english(row: dict[str, Any]) -> dict[str, Any]:
    if row["n"] == 5:
        raise DataError("text is not English")
    return row


def keeps_english(row: dict[str, Any]) -> bool:
    return not_english(row) is row


def fails_everywhere(row: dict[str, Any]) -> dict[str, Any]:
    raise ValueError(f"row {row['n']} is refused")


def exit_at_row_one(row: dict[str, Any]) -> dict[str, Any]:
    if row["n"] == 1:
        os._exit(3)  # the process dies, as one killed for memory does
    return row


def stuck_where_marked(row: dict[str, Any]) -> dict[str, Any]:
    if row["mark"]:
        Path(row["mark"]).touch()
        time.sleep(300)  # a stuck regex, a network call without a timeout
    return row


def numbered(count: int, name: str = "d", shard_size: int = 8) -> Dataset:
    texts = prose_documents(count, seed=4, max_words=40)
    return Dataset.from_dict(name, {"text": texts, "n": list(range(count))}, shard_size=shard_size)


def payload_pipeline(tokenizer: Any, fn: Any, field: str, runner: str, lanes: int) -> Pipeline:
    source = StaticMixtureWorkSource([numbered(200, "a"), numbered(150, "b")], seed=5)
    return (
        Pipeline(source)
        .options(canonical_replicas=lanes)
        .map(fn)
        .tokenize(tokenizer=tokenizer, runner=runner, parallelism=1)  # type: ignore[arg-type]
        .pack_sequences(128, payload_fields=[field])
        .batch(2)
    )


def test_tensor_payloads_come_back_from_worker_processes_by_value_holding_no_descriptor(
    tokenizer: Any,
) -> None:
    """A chunk came back through multiprocessing's pickler, where torch sends each tensor as
    a shared-memory file descriptor: the loop held one per document read ahead (8,000 with 4
    lanes), so under the usual `ulimit -n` of 1024 the pool broke. Threads and processes now
    give the same batches, and processes hold no descriptor per document."""

    def run(runner: str) -> tuple[list[Any], int]:
        pipeline = payload_pipeline(tokenizer, tensor_payload, "vec", runner, lanes=4)
        before, most, out = len(os.listdir("/proc/self/fd")), 0, []
        for batch in pipeline:
            most = max(most, len(os.listdir("/proc/self/fd")))
            assert batch.payloads is not None
            vectors = [[p["vec"].tolist() for p in row] for row in batch.payloads]
            out.append((batch.input_ids.tolist(), vectors))
        return out, most - before

    threads, _ = run("threads")
    processes, descriptors = run("processes")
    assert processes == threads
    assert descriptors < 40  # the pool's pipes; it was a descriptor per document read ahead


def test_a_payload_value_pickle_cannot_take_names_its_row_and_field_under_processes(
    tokenizer: Any,
) -> None:
    """A memoryview in a payload field came from a worker process as a bare TypeError naming
    neither the row nor the field (threads and inline pass it on as it is)."""
    source = StaticMixtureWorkSource([numbered(20)], shuffle=False)
    pipeline = (
        Pipeline(source)
        .map(memoryview_payload)
        .tokenize(tokenizer=tokenizer, runner="processes", parallelism=1)
        .pack_sequences(128, payload_fields=["blob"])
        .batch(2)
    )
    with pytest.raises(DataError) as caught:
        next(iter(pipeline))
    error = caught.value
    assert (error.dataset, error.shard, error.row) == ("d", "memory://d/0", 0)
    assert "payload field 'blob' holds a memoryview" in str(error)
    assert "with runner='processes'" in str(error) and "picklable" in str(error)


def test_a_broken_pool_with_a_cause_says_what_broke_it_and_claims_no_kill() -> None:
    """Every BrokenProcessPool was explained as a process killed (out of memory?) or failing
    as it started, also where the pool said that the parent failed to read a result (running
    out of file descriptors), two links down the cause chain."""
    pool = BrokenProcessPool("A process in the process pool was terminated abruptly")
    pool.__cause__ = _RemoteTraceback(
        "\n'''\nTraceback (most recent call last):\n  File \"x.py\", line 1, in recv\n"
        "RuntimeError: received 0 items of ancdata\n'''"
    )
    text = str(_broken(pool))
    assert "RuntimeError: received 0 items of ancdata" in text
    assert "killed" not in text and "__main__" not in text
    killed = str(_broken(BrokenProcessPool("A child process terminated abruptly")))
    assert "killed (out of memory?)" in killed and '`if __name__ == "__main__":`' in killed


def test_a_chunk_submitted_to_a_broken_pool_gets_the_explained_error() -> None:
    """The next chunk's submit to a pool a killed process had broken raised the pool's bare
    "A child process terminated abruptly", without the explanation the README promises; in a
    loop that consumes steadily (an out-of-memory kill) it was the usual case."""
    data = Dataset.from_dict("d", {"ids": [[1, 2, 3]] * 8, "n": list(range(8))}, shard_size=4)
    source = StaticMixtureWorkSource([data], shuffle=False)
    recipe = Pipeline(source).map(exit_at_row_one).pretokenized("ids", runner="processes")
    runner = Runner(
        DocChain(FetchOp(source.datasets), doc_ops(recipe)), parallelism=1, kind="processes"
    )
    layout = source.layouts[0]
    try:
        killing = runner.submit(0, layout.span(pass_index=0, lane=0, num_lanes=1, start=0, count=2))
        assert isinstance(killing.exception(timeout=60), BrokenProcessPool)
        span = layout.span(pass_index=0, lane=0, num_lanes=1, start=2, count=2)
        said = r"runner='processes' ended abruptly \(exited with code 3\): its code failed"
        with pytest.raises(BrokenProcessPool, match=said):
            runner.submit(0, span)
    finally:
        runner.close()


def _wait_for(what: str, ready: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 60
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited 60 s for {what}")
        time.sleep(0.001)


def test_closing_a_busy_pool_lets_its_thread_end_cleanly_whatever_it_sees_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``close`` cancelled the pool's pending futures itself, and they stayed in the table of
    the pool's thread until it saw the shutdown. Where that thread saw its ended processes
    first (a loop left early in a thread, in a review's runs), Python 3.11 failed to set their
    error (InvalidStateError: CANCELLED): the thread died with a traceback, skipping the
    pool's clean-up, and the futures after it never finished. A chunk's future cancelled
    afterwards (a reader dropping its read-ahead) cancelled the pool's future the same way.
    Here the thread is held at the top of its loop (on the call queue's lock) while ``close``
    runs, so that it sees the ended processes before the shutdown."""
    died: list[str] = []
    monkeypatch.setattr(
        threading,
        "excepthook",
        lambda hook: died.append(f"{hook.exc_type.__name__}: {hook.exc_value}"),
    )
    mark = tmp_path / "stuck"
    data = Dataset.from_dict(
        "d", {"ids": [[1, 2, 3]] * 6, "mark": [str(mark)] + [""] * 5}, shard_size=6
    )
    source = StaticMixtureWorkSource([data], shuffle=False)
    recipe = Pipeline(source).map(stuck_where_marked).pretokenized("ids", runner="processes")
    runner = Runner(
        DocChain(FetchOp(source.datasets), doc_ops(recipe)), parallelism=1, kind="processes"
    )
    layout = source.layouts[0]

    def chunk(row: int) -> Any:
        return runner.submit(0, layout.span(pass_index=0, lane=0, num_lanes=1, start=row, count=1))

    chunks = [chunk(0)]  # the one worker takes it and is stuck in the map
    executor = runner._executor
    assert isinstance(executor, ProcessPoolExecutor)
    manager = executor._executor_manager_thread
    assert manager is not None
    processes = list(executor._processes.values())
    _wait_for("the worker to be stuck in the map", mark.exists)
    chunks.append(chunk(1))
    _wait_for(
        "chunk 1 to wait in the call queue (running, for the pool)",
        lambda: (
            all(f.running() for f in list(runner._pending))
            and "wait_result_broken_or_wakeup" in thread_stack(manager)
        ),
    )
    holding = executor._call_queue._notempty
    with holding:
        chunks.append(chunk(2))  # the pool's thread puts it in the call queue: held there
        _wait_for(
            "the pool's thread to wait for the call queue's lock",
            lambda: thread_stack(manager)[:3] == ["__enter__", "put", "add_call_item_to_queue"],
        )
        chunks += [chunk(3), chunk(4)]  # pending: the call queue is full
        runner.close()
        for future in chunks[3:]:  # then the readers drop their read-ahead (LaneRuntime.close)
            assert future.cancel()
        # the worker ended (and the result pipe's last writer with it) before the thread goes on
        assert multiprocessing.connection.wait([p.sentinel for p in processes], timeout=60)
    manager.join(60)
    assert not manager.is_alive()
    assert died == []
    for future in chunks[:3]:  # each told, none left waiting
        assert isinstance(future.exception(timeout=60), BrokenProcessPool)


def test_an_iteration_that_fails_to_start_leaves_no_pool_or_chain_file(
    tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runner made before the token estimation failed (here a map refusing its documents)
    was never closed: each failed iter() kept the pool's pipes, the chain file and its lock
    for as long as its error was held (a retry loop keeping its errors, pytest.raises)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    source = StaticMixtureWorkSource(
        [numbered(40)], seed=1, token_estimation=TokenEstimation(calibration_documents=4)
    )
    pipeline = (
        Pipeline(source)
        .map(fails_everywhere)
        .tokenize(tokenizer=tokenizer, runner="processes", parallelism=1)
        .pack_flat(32)
        .batch(2)
    )
    before = len(os.listdir("/proc/self/fd"))
    errors = []
    for _ in range(3):
        with pytest.raises(DataError, match="is refused") as caught:
            iter(pipeline)
        errors.append(caught.value)  # held, with its traceback and every frame's locals
    assert list(tmp_path.iterdir()) == []
    assert len(os.listdir("/proc/self/fd")) <= before + 1  # multiprocessing's resource tracker


@pytest.mark.parametrize(
    ("kind", "runner"), [("map", "threads"), ("filter", "inline"), ("map", "processes")]
)
def test_a_data_error_a_user_function_raises_names_the_document(kind: str, runner: str) -> None:
    """A map or filter raising zephon_torch's own DataError (the type the README gives bad
    input) reached the loop naming no dataset, shard or row."""
    data = Dataset.from_dict("d", {"ids": [[1, 2, 3]] * 8, "n": list(range(8))}, shard_size=4)
    recipe = Pipeline(StaticMixtureWorkSource([data], shuffle=False))
    recipe = recipe.map(not_english) if kind == "map" else recipe.filter(keeps_english)
    pipeline = recipe.pretokenized("ids", runner=runner, parallelism=1)  # type: ignore[arg-type]
    with pytest.raises(DataError) as caught:
        list(pipeline.pack_flat(8).batch(1))
    error = caught.value
    assert (error.dataset, error.shard, error.row) == ("d", "memory://d/1", 1)
    hint = " (options(bad_rows='skip') skips such rows and counts them)"
    assert str(error) == "dataset 'd', shard 'memory://d/1', row 1: text is not English" + hint
    assert error.detail == "text is not English" + hint


_LEAVE_A_SLOW_MAP = """
import os, sys, time
from pathlib import Path

from tests.conftest import prose_documents
from tests.helpers import thread_stack
from zephon_torch import Pipeline
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource


def slow_last_row(row):
    if row["n"] == 199:
        Path(os.environ["SLOW_MARK"]).touch()
        time.sleep(300)  # a stuck regex, a network call without a timeout
    return row


if __name__ == "__main__":
    data = Dataset.from_dict("d", {"ids": [[1, 2, 3]] * 200, "n": list(range(200))})
    for runner in sys.argv[1:]:
        os.environ["SLOW_MARK"] = mark = f"{sys.argv[0]}.{runner}"
        recipe = Pipeline(StaticMixtureWorkSource([data], shuffle=False))
        recipe = recipe.options(read_ahead=64).map(slow_last_row)
        pipeline = recipe.pretokenized("ids", runner=runner, parallelism=2).pack_flat(8).batch(1)
        for batch in pipeline:  # every chunk is read ahead at once: the last runs its map
            deadline = time.monotonic() + 60
            while not os.path.exists(mark) and time.monotonic() < deadline:
                time.sleep(0.05)
            break
        print("left", runner, time.monotonic(), flush=True)
"""


def test_a_loop_left_while_a_map_is_stuck_lets_the_process_exit(tmp_path: Path) -> None:
    """A map call still running when the loop was left (break, an error, Ctrl-C) held the
    process until it returned: the threads runner's pool threads were joined at exit, and
    the processes runner's pool waited for its workers to finish their chunks."""
    script = tmp_path / "leave.py"
    script.write_text(_LEAVE_A_SLOW_MAP)
    environment = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])}
    done = subprocess.run(
        [sys.executable, str(script), "threads", "processes"],
        capture_output=True,
        text=True,
        timeout=150,  # the maps sleep 300 s each
        check=False,
        env=environment,
    )
    ended = time.monotonic()  # one clock for every process of the machine
    assert done.returncode == 0 and done.stderr == "", done.stderr
    left = re.findall(r"^left (\w+) ([\d.]+)$", done.stdout, re.MULTILINE)
    assert [runner for runner, _ in left] == ["threads", "processes"]
    assert ended - float(left[-1][1]) < 20


_ITERATE_UNTIL_INTERRUPTED = """
import os, signal, time
from pathlib import Path

from zephon_torch import Pipeline
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource


def marked(row):
    Path(f"{os.environ['WORKER_MARK']}.{os.getpid()}").touch()
    return row


if __name__ == "__main__":
    stopping = []
    if os.environ.get("OWN_HANDLER"):  # Ctrl-C, or SIGTERM: stop after the next checkpoint
        signum = getattr(signal, os.environ["OWN_HANDLER"])
        signal.signal(signum, lambda *_: stopping.append(time.monotonic()))
    data = Dataset.from_dict("d", {"ids": [[1, 2, 3]] * 200}, shard_size=8)
    recipe = Pipeline(StaticMixtureWorkSource([data], exhaustion="repeat")).map(marked)
    pipeline = recipe.pretokenized("ids", runner="processes", parallelism=2).pack_flat(8).batch(1)
    starting = os.environ.get("READY") == "starting"  # the signal lands as the processes start
    if starting:
        print("ready", flush=True)
    for step, batch in enumerate(pipeline):
        if step == 100 and not starting:
            print("ready", flush=True)
        if stopping and time.monotonic() - stopping[0] > 3:  # the steps to the checkpoint
            print("checkpointed", flush=True)
            break
"""


def _both(folder: Path, mark: str) -> Callable[[int], bool]:
    """Whether both workers have left their marks (started; a worker still importing when
    Ctrl-C lands prints its own traceback, its handler not yet set)."""
    return lambda _: len(list(folder.glob(f"{mark}.*"))) == 2


def _spawned(job: int) -> bool:
    """Whether both worker processes of ``job`` are spawned: they import for seconds then."""
    command = ["pgrep", "-P", str(job), "-f", "spawn_main"]
    return len(subprocess.run(command, capture_output=True, check=False).stdout.split()) == 2


def test_ctrl_c_under_processes_gives_one_traceback_and_leaves_no_process(tmp_path: Path) -> None:
    """Ctrl-C reaches every process of the terminal's group: each idle worker printed its own
    KeyboardInterrupt traceback under the loop's. Workers now leave Ctrl-C to the parent,
    which ends them as it leaves."""
    script = tmp_path / "interrupted.py"
    script.write_text(_ITERATE_UNTIL_INTERRUPTED)

    group, _, err = interrupt_group(
        script, _both(tmp_path, "worker"), WORKER_MARK=str(tmp_path / "worker")
    )
    assert err.count("Traceback") == 1 and err.rstrip().endswith("KeyboardInterrupt"), err
    assert group_ended(group), "a worker process outlived the interrupted loop"


def test_a_worker_ends_when_its_parent_died_before_the_worker_started() -> None:
    """The worker read its parent's pid itself, after seconds of start-up: a parent killed in
    that window was already gone (the pid read was init's), and the worker lived on for ever.
    The pid now comes from the parent; here one that is not this worker's parent."""
    script = (
        "import time; from zephon_torch.ops import _runner_worker; "
        "_runner_worker.init_worker('/nonexistent/chain', 2**22 + 1); time.sleep(60)"
    )
    environment = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])}
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=environment,
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert done.returncode == 1 and done.stderr == "", done.stderr  # ended by the watch
    assert time.monotonic() - start < 50


_INTERRUPTED_IN_THE_STEP = """
import os, sys, time
from pathlib import Path

from zephon_torch import Pipeline
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource


def slow_after_forty(row):
    if row["ids"][0] >= 40:
        Path(f"{os.environ['SLOW_MARK']}.{os.getpid()}").touch()
        time.sleep(300)  # a huge document, a remote lookup
    return row


if __name__ == "__main__":
    data = Dataset.from_dict("d", {"ids": [[i, 2, 2] for i in range(200)]}, shard_size=8)
    recipe = Pipeline(StaticMixtureWorkSource([data], exhaustion="repeat", shuffle=False))
    recipe = recipe.map(slow_after_forty).options(read_ahead=64)
    pipeline = recipe.pretokenized("ids", runner="processes", parallelism=2).pack_flat(8)
    batches = iter(pipeline.batch(1))
    next(batches)
    print("ready", flush=True)
    time.sleep(300)  # the training step: Ctrl-C lands here, outside the pipeline
"""


def test_ctrl_c_in_the_training_step_ends_a_job_whose_worker_is_in_a_slow_map(
    tmp_path: Path,
) -> None:
    """Workers that ignore SIGINT held the job at exit: the parent's KeyboardInterrupt left the
    loop without closing the runner, and the pool joined at exit waited for the map. The
    runners still open are now closed by an exit hook run before that join."""
    script = tmp_path / "step.py"
    script.write_text(_INTERRUPTED_IN_THE_STEP)

    _, _, err = interrupt_group(script, _both(tmp_path, "slow"), SLOW_MARK=str(tmp_path / "slow"))
    assert err.count("Traceback") == 1 and err.rstrip().endswith("KeyboardInterrupt"), err


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("when", ["started", "starting"])
def test_a_loop_that_takes_the_signal_itself_goes_on_to_its_checkpoint(
    tmp_path: Path, name: str, when: str
) -> None:
    """Its own handler of Ctrl-C, or of the SIGTERM a scheduler sends the job's group before
    its SIGKILL ("stop after the next checkpoint"), kept the loop going, but the workers had
    died of the same signal: the next chunk raised BrokenProcessPool (blaming memory). So
    did workers still importing (seconds), before they could ignore it."""
    script = tmp_path / "graceful.py"
    script.write_text(_ITERATE_UNTIL_INTERRUPTED)

    marks, signum = str(tmp_path / "worker"), getattr(signal, name)
    ready = _both(tmp_path, "worker") if when == "started" else _spawned
    mark = {"WORKER_MARK": marks, "OWN_HANDLER": name, "READY": when}
    _, out, err = interrupt_group(script, ready, signum, **mark)
    assert out == "checkpointed\n" and err == "", err


def _exit_at_once() -> None:
    pass


def test_a_forked_child_leaves_the_parent_s_worker_processes_alone() -> None:
    """The exit hook that closes open processes runners ran in forked children too (a torch
    DataLoader worker runs threading's exit hooks), and ended the parent's pool."""
    import multiprocessing

    data = Dataset.from_dict("d", {"ids": [[1, 2, 3]] * 200}, shard_size=8)
    recipe = Pipeline(StaticMixtureWorkSource([data], exhaustion="repeat"))
    pipeline = recipe.pretokenized("ids", runner="processes", parallelism=2).pack_flat(8)
    batches = iter(pipeline.batch(1))
    for _ in range(50):
        next(batches)
    child = multiprocessing.get_context("fork").Process(target=_exit_at_once)
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    for _ in range(2000):  # a few passes: new chunks for the workers
        next(batches)


_LEFT_BY_BREAK = """
import atexit, threading, time
from zephon_torch import Pipeline
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource

def slow(row):  # chunks of many rows take a few hundred ms
    time.sleep(0.005)
    return row

rows = {"ids": [[i % 50 + 1] * 8 for i in range(400)]}
source = StaticMixtureWorkSource([Dataset.from_dict("d", rows)], seed=1)
pipeline = Pipeline(source).map(slow).pretokenized("ids", parallelism=2, runner="threads")
for batch in pipeline.pack_flat(16).batch(2):
    break

def left():  # runs after threading's exit hooks
    names = [t.name for t in threading.enumerate() if t.name.startswith("zephon-docs")]
    print("left at exit:", names, flush=True)

atexit.register(left)
"""


def test_a_loop_left_by_break_leaves_no_reader_thread_running_at_exit(tmp_path: Path) -> None:
    """The threads runner of an iteration left by `break` stayed open, its threads inside a
    tokenizer's native batch encode as the interpreter was torn down, which can abort the
    process ("terminate called without an active exception", seen once from the quickstart).
    The runners still open are closed at exit, their running chunk waited for."""
    script = tmp_path / "left.py"
    script.write_text(_LEFT_BY_BREAK)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "left at exit: []" in done.stdout, done.stdout


_CLOSE_AND_EXIT = """
import time
from concurrent.futures import process

from zephon_torch.io import Dataset
from zephon_torch.ops._doc_chain import DocChain
from zephon_torch.ops._runner import Runner
from zephon_torch.ops.fetch import FetchOp
from zephon_torch._token_stage import doc_ops
from zephon_torch import Pipeline
from zephon_torch.work import StaticMixtureWorkSource


def late_wakeup(self):  # the exit hook's race, made certain: the thread closes the pipe meanwhile
    if not self._closed:
        time.sleep(0.5)
        self._writer.send_bytes(b"")


if __name__ == "__main__":
    process._ThreadWakeup.wakeup = late_wakeup
    data = Dataset.from_dict("d", {"ids": [[1, 2, 3]] * 8}, shard_size=4)
    source = StaticMixtureWorkSource([data], shuffle=False)
    recipe = Pipeline(source).pretokenized("ids", runner="processes")
    chain = DocChain(FetchOp(source.datasets), doc_ops(recipe))
    runner = Runner(chain, parallelism=1, kind="processes")
    span = source.layouts[0].span(pass_index=0, lane=0, num_lanes=1, start=0, count=2)
    print(len(runner.submit(0, span).result(timeout=60)), flush=True)
    runner.close()  # then the interpreter exits at once
"""


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="Python 3.12 locks the pipe's writes")
def test_a_process_runner_closed_just_before_exit_exits_quietly(tmp_path: Path) -> None:
    """Python < 3.12's exit hook for process pools wrote to a closed pool thread's wake-up
    pipe as that thread closed it: "Exception ignored ... OSError: [Errno 9] Bad file
    descriptor" on stderr (the Ctrl-C test, in a CI run). The pool's thread is joined first."""
    script = tmp_path / "close_and_exit.py"
    script.write_text(_CLOSE_AND_EXIT)
    environment = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])}
    done = subprocess.run(
        [sys.executable, str(script)],
        check=False,
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "2\n", "")
