"""What an ended iteration lets go of at once, without waiting for the garbage collector: a
training process of millions of objects runs a full collection rarely, so what only a
collection frees builds up (open files, mapped line indexes) with every pipeline left."""

from __future__ import annotations

import gc
import json
import os
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import memory_copy
from zephon_torch import DataError, Pipeline
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource, TokenEstimation


@pytest.fixture
def no_collection() -> Iterator[None]:
    """The cyclic garbage collector off: only reference counts free objects."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def open_files_settled(most: int, within: float) -> int:
    """The open descriptors once at most ``most``, or after ``within`` seconds: a process pool
    shut down closes its pipes once its processes have ended (3-4 s after a start cut short)."""
    deadline = time.monotonic() + within
    while open_files() > most and time.monotonic() < deadline:
        time.sleep(0.1)
    return open_files()


def corpus_with_a_bad_row(folder: Path) -> Path:
    """Eight JSONL shards; shard 5's row 17 is not JSON."""
    folder.mkdir()
    for shard in range(8):
        lines = [json.dumps({"text": f"shard {shard} row {row} " * 20}) for row in range(30)]
        if shard == 5:
            lines[17] = "{not json"
        (folder / f"part-{shard}.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def failing_pipeline(folder: Path, tokenizer: Any, runner: str, index: Path) -> Pipeline:
    dataset = Dataset.from_path("bad", folder, index_cache_dir=str(index))
    source = StaticMixtureWorkSource(
        [dataset], seed=1, token_estimation=TokenEstimation(calibration_documents=4)
    )
    return (
        Pipeline(source)
        .tokenize(tokenizer=tokenizer, parallelism=2, runner=runner)  # type: ignore[arg-type]
        .pack_flat(64)
        .batch(2)
    )


@pytest.mark.parametrize(("runner", "cycles"), [("threads", 10), ("inline", 10), ("processes", 1)])
def test_a_pipeline_whose_iteration_raised_is_freed_with_its_open_files(
    tmp_path: Path, tokenizer: Any, no_collection: None, runner: str, cycles: int
) -> None:
    """A frame of the error's traceback held the future (or the prefetcher's item) that held
    the error: a cycle through the frames up to the pipeline's, so a pipeline that raised a
    DataError kept its datasets' shard files and line indexes open (16 descriptors here) until
    a full collection, and an evaluation loop that went on after such errors ran out of them."""
    folder = corpus_with_a_bad_row(tmp_path / "data")
    before = open_files()
    for _ in range(cycles):
        pipeline = failing_pipeline(folder, tokenizer, runner, tmp_path / "index")
        freed = weakref.ref(pipeline)
        try:
            for _ in pipeline:
                pass
        except DataError as error:
            assert "malformed JSON" in str(error)
        else:
            pytest.fail("the bad row raised nothing")
        del pipeline
        assert freed() is None
    most = before + (runner == "processes")  # multiprocessing's resource tracker
    assert open_files_settled(most, within=30 if runner == "processes" else 0) <= most


def parquet_with_a_damaged_shard(folder: Path) -> Dataset:
    """Eight Parquet shards, opened, then shard 5's metadata overwritten (same size)."""
    folder.mkdir()
    for shard in range(8):
        texts = [f"shard {shard} row {row} " * 20 for row in range(30)]
        pq.write_table(pa.table({"text": texts}), folder / f"part-{shard}.parquet")
    dataset = Dataset.from_path("damaged", folder)
    damaged = folder / "part-5.parquet"
    data = bytearray(damaged.read_bytes())
    data[-200:-8] = b"\xff" * 192  # the footer, before its length and magic
    damaged.write_bytes(bytes(data))
    return dataset


@pytest.mark.parametrize("runner", ["threads", "inline"])
def test_a_pipeline_that_met_a_damaged_shard_is_freed_with_its_open_files(
    tmp_path: Path, tokenizer: Any, no_collection: None, runner: str
) -> None:
    """The shard cache's frame that loaded a shard held the error the load raised (kept for
    other threads waiting on the same shard): the same cycle, through the reader's frames."""
    before = open_files()
    dataset = parquet_with_a_damaged_shard(tmp_path / "data")
    source = StaticMixtureWorkSource([dataset], seed=1)  # no calibration: read by the runner
    pipeline = (
        Pipeline(source)
        .tokenize(tokenizer=tokenizer, parallelism=2, runner=runner)  # type: ignore[arg-type]
        .pack_flat(64)
        .batch(2)
    )
    freed = weakref.ref(pipeline)
    with pytest.raises(DataError, match=r"part-5\.parquet"):
        for _ in pipeline:
            pass
    del pipeline, dataset, source
    assert freed() is None
    assert open_files() <= before


def test_a_remote_dataset_let_go_closes_its_shard_files(
    tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch, no_collection: None
) -> None:
    """A remote dataset's reader handed its own methods to its downloads and its local reader,
    which it holds: a cycle, so each remote dataset made for a run (an evaluation loop building
    its pipeline each epoch) kept its open shard files (17 descriptors for 16 Parquet shards)
    until a full collection."""
    monkeypatch.setenv("ZEPHON_TORCH_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "data"
    folder.mkdir()
    for shard in range(16):
        texts = [f"shard {shard} row {row} " * 20 for row in range(10)]
        pq.write_table(pa.table({"text": texts}), folder / f"part-{shard:02d}.parquet")
    url = memory_copy(folder)
    before = open_files()
    for _ in range(10):
        dataset = Dataset.from_path("remote", url)
        source = StaticMixtureWorkSource([dataset], seed=1)  # no calibration: read by the runner
        pipeline = Pipeline(source).tokenize(tokenizer=tokenizer).pack_flat(64).batch(2)
        for _, _batch in zip(range(30), pipeline):
            pass
        del pipeline, source, dataset
    assert open_files() <= before
