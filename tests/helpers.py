"""Helpers shared by tests: build small pipelines, compare streams, resume at every step, and
the stateful filters, shard cache objects and loader pipelines that families of tests share."""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import fsspec
import numpy.typing as npt
import pytest

from tests.conftest import prose_documents
from tests.loopback import serve_in_thread
from zephon_torch import Batch, Pipeline
from zephon_torch._lane_split import MID_STEP
from zephon_torch._packed_rows import unpack_lanes
from zephon_torch.io import Dataset
from zephon_torch.io._line_index import scan_lines
from zephon_torch.io._shard_cache import CachedObject
from zephon_torch.ops.stateful import StatefulFilter
from zephon_torch.work import StaticMixtureWorkSource, TokenEstimation

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess


def _pydoc_text_digest() -> str:
    import hashlib

    from zephon_torch._corpus import pydoc_prose_documents

    text = json.dumps(pydoc_prose_documents(), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


# The tests' text and tokenizer come from the running Python's pydoc topics, which each Python
# release rewrites. A few tests build their scenario from where lanes run out on the text of
# CPython 3.11.7, the CI Python (a rank a turn behind, lanes spent at given turns): on another
# release's text the same data runs out elsewhere, and the scenario is not there to test.
MEASURED_TEXT = "42013c0f9d9218e47180e68fe4c59f86ff121ec06e553b138d89be12def98d52"
on_measured_text = pytest.mark.skipif(
    _pydoc_text_digest() != MEASURED_TEXT,
    reason="its scenario is built on CPython 3.11.7's pydoc topics; this Python's differ",
)


def destroy_process_group() -> None:
    """`torch.distributed.destroy_process_group()`, after 0.2 s without the GIL on torch before
    2.8, whose gloo destructor joins a thread that may still wait for the GIL to free the last
    collective's tensors (see `leave_process_group` in examples/train_loop.py)."""
    import torch
    import torch.distributed as dist
    from torch.torch_version import TorchVersion

    if TorchVersion(torch.__version__) < (2, 8):
        time.sleep(0.2)
    dist.destroy_process_group()


def two_sources(rows_a: int = 60, rows_b: int = 40, *, shard_size: int = 13) -> list[Dataset]:
    """Two in-memory datasets of real prose with different length profiles."""
    a = prose_documents(rows_a, seed=1, max_words=300)
    b = prose_documents(rows_b, seed=2, min_words=1, max_words=60)
    return [
        Dataset.from_dict(
            "long", {"text": a, "id": [f"a{i}" for i in range(rows_a)]}, shard_size=shard_size
        ),
        Dataset.from_dict(
            "short", {"text": b, "id": [f"b{i}" for i in range(rows_b)]}, shard_size=shard_size
        ),
    ]


def small_pipeline(
    tokenizer: Any,
    *,
    algorithm: str = "wrap",
    lanes: int = 1,
    world_size: int | None = None,
    rank: int | None = None,
    parallelism: int = 2,
    runner: str = "threads",
    exhaustion: str = "stop",
    max_length: int = 64,
    microbatch_size: int = 2,
    datasets: list[Dataset] | None = None,
    prefetch: int | Literal["auto"] = 4,
) -> Pipeline:
    source = StaticMixtureWorkSource(
        datasets or two_sources(),
        {"long": 0.6, "short": 0.4},
        seed=7,
        token_estimation=TokenEstimation(calibration_documents=4),
        exhaustion=exhaustion,  # type: ignore[arg-type]
    )
    return (
        Pipeline(source)
        .options(canonical_replicas=lanes, world_size=world_size, rank=rank, prefetch=prefetch)
        .tokenize(tokenizer=tokenizer, parallelism=parallelism, runner=runner)  # type: ignore[arg-type]
        .pack_flat(max_length, algorithm)  # type: ignore[arg-type]
        .batch(microbatch_size)
    )


def as_lists(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with its lanes' packed parts (``_packed_rows``) as lists, as the pipeline
    holds them; a state of lists loads as well, so tests edit states in this form."""
    return {**state, "lanes": unpack_lanes(state["lanes"])}


def key(batch: Batch) -> tuple[Any, ...]:
    """Everything data-bearing in a batch, hashable and comparable."""
    return (
        batch.lane,
        batch.turn,
        batch.input_ids.tobytes(),
        json.dumps([batch.lengths, batch.sources, batch.starts_document]),
    )


def keys(batches: Iterator[Batch] | list[Batch], limit: int | None = None) -> list[tuple[Any, ...]]:
    out = []
    for i, b in enumerate(batches):
        if limit is not None and i >= limit:
            break
        out.append(key(b))
    return out


def next_batches(pipeline: Pipeline, count: int) -> list[Any]:
    """The first `count` batches of a new iteration of `pipeline`."""
    batches = iter(pipeline)
    return [next(batches) for _ in range(count)]


def assert_resumes_at_every_step(build: Callable[[], Pipeline], *, max_steps: int = 10_000) -> int:
    """Record the state after each delivered batch; each, restored into a fresh pipeline, must
    give exactly the rest of the uninterrupted stream. Returns the stream length."""
    pipeline = build()
    reference: list[tuple[Any, ...]] = []
    states: list[dict[str, Any]] = [pipeline.state_dict()]
    for batch in pipeline:
        reference.append(key(batch))
        state = pipeline.state_dict()
        assert json.loads(json.dumps(state)) == state
        states.append(state)
        if len(reference) >= max_steps:
            break
    assert reference, "the pipeline produced nothing"
    for step, state in enumerate(states):
        resumed = build()
        with warnings.catch_warnings():  # most of these states are mid-step, on purpose
            warnings.filterwarnings("ignore", MID_STEP)
            resumed.load_state_dict(json.loads(json.dumps(state)))
        rest = keys(resumed, limit=len(reference) - step)
        assert rest == reference[step:], f"resume from step {step} diverged"
    return len(reference)


@contextlib.contextmanager
def serve_without_versions(folder: Path) -> Iterator[str]:
    """An HTTP server on loopback serving ``folder`` with neither ETag nor Last-Modified (so
    no object has a version); yields its base URL."""

    class NoVersions(http.server.SimpleHTTPRequestHandler):
        def send_header(self, keyword: str, value: str) -> None:
            if keyword.lower() not in ("last-modified", "etag"):
                super().send_header(keyword, value)

        def log_message(self, *args: Any) -> None:
            pass

    with serve_in_thread(functools.partial(NoVersions, directory=str(folder))) as url:
        yield url


def run_group(
    cmd: list[str],
    *,
    env: dict[str, str] | None = None,
    timeout: float,
    sigterm_at: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(cmd)`` with its output captured, in a session of its own: past
    ``timeout`` every process of it is killed and the test fails saying so. A plain timeout
    killed torchrun alone and left its ranks (and their DataLoader workers) waiting in a
    collective for good. With ``sigterm_at``, the group gets SIGTERM (Slurm's, before its
    SIGKILL) once that file exists."""
    with subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    ) as job:  # fmt: skip
        deadline = time.monotonic() + timeout
        while sigterm_at and not sigterm_at.exists() and time.monotonic() < deadline:
            if job.poll() is not None:
                break
            time.sleep(0.05)
        if sigterm_at and job.poll() is None:
            os.killpg(job.pid, signal.SIGTERM)
        try:
            out, err = job.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            out, err = job.communicate()
            pytest.fail(f"{cmd[-1]!r}... ran past {timeout} s; stderr: {err[-3000:]}")
    return subprocess.CompletedProcess(cmd, job.returncode, out, err)


ROOT = Path(__file__).resolve().parents[1]


def run_torchrun(
    script: str, nproc: int, *args: str, timeout: float = 300, sigterm_at: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``tests/integration/<script>`` run by torchrun on ``nproc`` ranks of this machine (gloo,
    one thread each), in a session of its own (see ``run_group``)."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
        str(ROOT / "tests" / "integration" / script), *args,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return run_group(cmd, env=env, timeout=timeout, sigterm_at=sigterm_at)


def interrupt_group(
    script: Path, ready: Callable[[int], bool], signum: int = signal.SIGINT, **env: str
) -> tuple[int, str, str]:
    """Runs ``script`` as a terminal's job (its own process group), waits for its "ready"
    line and then for ``ready(pid)`` (the job's), and sends the group ``signum``, as Ctrl-C
    (or Slurm, before its SIGKILL) does: the job's pid (its group's id) and what it wrote to
    stdout after "ready", and to stderr."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    job = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=environment,
        start_new_session=True,
    )
    try:
        assert job.stdout is not None and job.stdout.readline() == "ready\n"
        deadline = time.monotonic() + 60
        while not ready(job.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ready(job.pid)
        os.killpg(job.pid, signum)
        out, err = job.communicate(timeout=30)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
    return job.pid, out, err


def group_ended(group: int, *, within: float = 20) -> bool:
    """Whether every process of ``group`` (a job's, see ``interrupt_group``) ends ``within``
    seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)  # a process of the group is left
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def memory_copy(folder: Path) -> str:
    """Every file under ``folder`` copied to a fresh memory:// folder; returns its URL."""
    fs = fsspec.filesystem("memory")
    root = f"/zt-{uuid.uuid4().hex[:8]}"
    for path in folder.rglob("*"):
        if path.is_file():
            fs.pipe(f"{root}/{path.relative_to(folder)}", path.read_bytes())
    return f"memory://{root}/"


def prefetch_threads() -> set[threading.Thread]:
    """The shard-prefetch threads alive now; a test compares with those alive at its start,
    as an earlier test's may still be retrying a store it stopped, in this process."""
    return {thread for thread in threading.enumerate() if thread.name == "zephon-prefetch"}


_OVERRIDES = "-dac_override,-dac_read_search"  # the capabilities that let root past file modes


def bound_by_modes(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    """``cmd`` run (output captured, in ``ROOT``) where file modes bind it: as it is for a user;
    for root, whom modes do not bind, under ``setpriv`` dropping the capabilities that override
    them. Skips the test where root has no ``setpriv`` that can."""
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("no setpriv to make file modes bind root")
        cmd = ["setpriv", f"--bounding-set={_OVERRIDES}", f"--inh-caps={_OVERRIDES}", *cmd]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120, check=False
    )
    if os.geteuid() == 0 and "setpriv:" in done.stderr:
        pytest.skip(f"setpriv cannot drop capabilities here: {done.stderr.strip()}")
    return done


def thread_stack(thread: threading.Thread) -> list[str]:
    """The functions ``thread`` is in, innermost first."""
    frame = sys._current_frames().get(thread.ident or 0)
    names = []
    while frame is not None:
        names.append(frame.f_code.co_name)
        frame = frame.f_back
    return names


# Stateful filters and a pipeline the stateful-filter tests share.


class KeepUnseen(StatefulFilter):
    """Deduplicates: keeps a document only the first time its ids are seen."""

    name = "keep_unseen"

    def __init__(self, limit: int = 10_000) -> None:
        self.seen: list[list[int]] = []
        self.calls, self.limit = 0, limit

    def keep(self, tokens: npt.NDArray[Any], source: str) -> bool:
        self.calls += 1
        assert self.calls < self.limit, "read on and on: the endless rejection was not caught"
        if tokens.tolist() in self.seen:
            return False
        self.seen.append(tokens.tolist())
        return True

    def state_dict(self) -> dict[str, Any]:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seen = [list(ids) for ids in state["seen"]]


class Warmup(StatefulFilter):
    """Skips the first ``skip`` documents; updates in place the dict it returns as state."""

    name = "warmup"

    def __init__(self, skip: int) -> None:
        self.skip, self.state = skip, {"seen": 0}

    def keep(self, tokens: npt.NDArray[Any], source: str) -> bool:
        self.state["seen"] += 1
        return self.state["seen"] > self.skip

    def state_dict(self) -> dict[str, Any]:
        return self.state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = dict(state)


def repeating_pipeline(rows: int) -> Pipeline:
    """`rows` documents of three equal ids each (1s, 2s, ...) under `exhaustion="repeat"`, read
    as pre-tokenized ids and packed three tokens a row."""
    ids = [[i + 1] * 3 for i in range(rows)]
    dataset = Dataset.from_dict("d", {"ids": ids})
    source = StaticMixtureWorkSource([dataset], exhaustion="repeat")
    return Pipeline(source).pretokenized("ids").pack_flat(3)


def not_five(row: dict[str, Any]) -> bool:
    """A plain filter that drops the documents whose first id is 5."""
    return bool(row["ids"][0] != 5)


# A line scanner the line index and CLI tests count the scans of.


class CountingScan:
    """The line index's scanner, counting its calls: set in place of `_line_index.scan_lines`
    to count the files an open scans."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, buffer: Any) -> Any:
        self.calls += 1
        return scan_lines(buffer)


# Shard cache objects, downloads and contents the shard cache tests share.


def cache_item(name: str, size: int, version: str = "v1") -> CachedObject:
    """The shard cache's record of the object `s3://bucket/{name}`."""
    return CachedObject(url=f"s3://bucket/{name}", size=size, version=version)


def cache_writer(content: bytes, delay: float = 0.0) -> Callable[[str], None]:
    """A shard cache download writing `content` in two halves, `delay` seconds apart."""

    def download(target: str) -> None:
        with open(target, "wb") as handle:
            half = len(content) // 2
            handle.write(content[:half])
            handle.flush()
            time.sleep(delay)
            handle.write(content[half:])

    return download


def cached_files(directory: Path) -> dict[str, bytes]:
    """The contents of the files in a shard cache folder, by name (its bookkeeping left out)."""
    return {p.name: p.read_bytes() for p in directory.iterdir() if not p.name.startswith(".")}


# Pipelines and item digests the DataLoader tests share.


# The loader tests' two sources: 40 long and 30 short documents, shards of 8.
LOADER_DATASETS = two_sources(40, 30, shard_size=8)


def loader_pipeline(tokenizer: Any, **kw: Any) -> Any:
    """`small_pipeline` over LOADER_DATASETS on 4 lanes unless told otherwise."""
    kw.setdefault("lanes", 4)
    kw.setdefault("datasets", LOADER_DATASETS)
    return small_pipeline(tokenizer, **kw)


def item_bytes(item: dict[str, Any]) -> bytes:
    """A loader item's ids, labels, positions and sequence bounds as one bytes value."""
    return b"".join(
        item[k].numpy().tobytes() for k in ("input_ids", "labels", "position_ids", "cu_seqlens")
    )


def take(loader: Any, n: int | None = None) -> list[bytes]:
    """The `item_bytes` of a loader's first `n` items (of all of them without `n`)."""
    out = []
    for item in loader:
        out.append(item_bytes(item))
        if n is not None and len(out) == n:
            break
    return out


def uneven_lanes(**options: Any) -> Any:
    """Lane 0 of 4 gets every long document, so it runs for many turns after the others."""
    rows = [{"input_ids": [i + 1] * (40 if i % 4 == 0 else 3)} for i in range(40)]
    dataset = Dataset.from_dict("d", rows)
    source = StaticMixtureWorkSource([dataset], seed=1, exhaustion="stop", shuffle=False)
    pipeline = Pipeline(source).options(canonical_replicas=4, **options)
    return pipeline.pretokenized("input_ids").pack_flat(16, "best_fit").batch(2)


# A spawned child imports the package and torch: 10-40 s on a loaded two-core machine, so it
# is waited for as long as it lives (bounded by far), not for a fixed time.
CHILD_S = 300


def until_ready_while_alive(ready: Callable[[], bool], child: BaseProcess) -> bool:
    """Waits until `ready()`, while `child` lives (at most `CHILD_S`); returns `ready()`."""
    deadline = time.monotonic() + CHILD_S
    while not ready() and child.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    return ready()
