"""A shard file cut short in place while it is mapped is a DataError naming it, not a SIGBUS
that kills the process (every reader that maps files: JSONL, `.npy`, MDS, LitData)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers import until_ready_while_alive
from tests.unit.io.test_io_formats_writers import sample_rows, write_litdata, write_mds
from zephon_torch.errors import DataError
from zephon_torch.io import Dataset


def _write(kind: str, folder: Path) -> Path:
    """A dataset of `kind` whose first shard's last row lies in its file's second half;
    returns that shard file."""
    if kind == "jsonl":
        path = folder / "a.jsonl"
        path.write_text("".join(json.dumps({"text": "x" * 90, "i": i}) + "\n" for i in range(2000)))
        return path
    if kind == "npy":
        np.save(folder / "a.npy", np.arange(200_000, dtype=np.int32))
        np.save(folder / "a.offsets.npy", np.arange(0, 200_001, 100))
        return folder / "a.npy"
    rows = [{**row, "text": row["text"] * 40} for row in sample_rows(200)]
    if kind == "mds":
        out = write_mds(folder / "mds", rows, {"text": "str", "id": "int"}, size_limit=1 << 22)
        return next(out.glob("*.mds"))
    out = write_litdata(folder / "litdata", rows, chunk_bytes=1 << 22)
    return next(out.glob("*.bin"))


@pytest.mark.parametrize("kind", ["jsonl", "npy", "mds", "litdata"])
def test_a_shard_cut_short_while_mapped_is_a_data_error_naming_it(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ZEPHON_TORCH_CACHE", str(tmp_path / "_cache"))
    shard = _write(kind, tmp_path)
    dataset = Dataset.from_path("d", tmp_path if kind in ("jsonl", "npy") else shard.parent)
    last = dataset.shards[0].num_rows - 1
    first = dataset.read_rows(0, [0])  # the shard is mapped now
    with open(shard, "r+b") as handle:  # rewritten in place, shorter
        handle.truncate(os.path.getsize(shard) // 2)
    cut = r"was cut to \d+ bytes while \d+ were mapped|was rewritten or appended to"
    with pytest.raises(DataError, match=cut) as caught:
        dataset.read_rows(0, [last])
    assert (caught.value.dataset, caught.value.shard) == ("d", dataset.shards[0].path)
    assert len(first) == 1


CUT_WHILE_READ = """
import json, os, pathlib, sys
import numpy as np
from zephon_torch import DataError, Pipeline
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource

base = pathlib.Path(sys.argv[1])
rng = np.random.default_rng(0)
for s in range(4):
    lines = (json.dumps({"ids": rng.integers(0, 999, int(rng.integers(200, 3000))).tolist()})
             for _ in range(500))
    (base / f"p{s}.jsonl").write_text("\\n".join(lines) + "\\n")
source = StaticMixtureWorkSource([Dataset.from_path("d", base)], exhaustion="stop")
pipeline = Pipeline(source).pretokenized("ids", runner="threads").pack_flat(1024).batch(2)
batches = iter(pipeline)
for _ in range(3):
    next(batches)
for path in base.glob("*.jsonl"):
    os.truncate(path, 200)  # in place, as a `cp` over the file does first
try:
    for _ in batches:
        pass
except DataError as error:
    print("DataError", error.shard, error.row)
"""


def test_a_jsonl_shard_cut_short_while_its_rows_are_read_is_a_data_error(tmp_path: Path) -> None:
    """The check before each read left the rows of one read call unguarded: shards cut in
    place while threads read them killed the process with SIGBUS (exit code -7), every time.
    Lines are read with pread now, which comes back short instead."""
    done = subprocess.run(
        [sys.executable, "-c", CUT_WHILE_READ, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "ZEPHON_TORCH_CACHE": str(tmp_path / "_cache")},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("DataError"), done.stdout + done.stderr[-2000:]


def test_a_jsonl_shard_changed_after_both_its_cache_entries_went_is_still_refused(
    tmp_path: Path,
) -> None:
    """The line index and the open file leave their LRUs apart: a shard changed after both
    went was indexed and read again as it is now, without a word (rows of another version
    than the dataset was opened with), whether cut short in place or replaced by rename."""
    from zephon_torch.io.jsonl import JsonlReader

    shards = [tmp_path / f"{name}.jsonl" for name in "abcd"]
    for shard in shards:
        lines = (json.dumps({"text": "x" * 90, "i": i}) + "\n" for i in range(2000))
        shard.write_text("".join(lines))
    reader = JsonlReader(dataset="d", index_cache_dir=str(tmp_path / "idx"), max_open=2)
    first, second, third, fourth = (str(shard) for shard in shards)
    reader.read(first, [0])  # indexed and open
    reader.read(second, [0])
    reader.read(third, [0])  # the first shard's index and file leave the LRUs
    with open(first, "r+b") as handle:
        handle.truncate(os.path.getsize(first) // 2 + 20)  # mid-line
    with pytest.raises(DataError, match="was rewritten or appended to") as caught:
        reader.num_rows(first)
    assert (caught.value.dataset, caught.value.shard) == ("d", first)
    replacement = tmp_path / "new.jsonl"
    replacement.write_text("".join(json.dumps({"i": -i}) + "\n" for i in range(2000)))
    os.replace(replacement, second)
    assert reader.read(second, [5]) == [{"text": "x" * 90, "i": 5}]  # still open: the old one
    reader.read(third, [1])
    reader.read(fourth, [1])  # the second shard's entries go
    with pytest.raises(DataError, match="replaced by another file"):
        reader.read(second, [5])
    fresh = JsonlReader(dataset="d", index_cache_dir=str(tmp_path / "idx"))
    assert fresh.read(second, [5]) == [{"i": -5}]
    rows = fresh.num_rows(first)  # opened again: the file as it is now
    assert 990 < rows < 1010
    assert fresh.read(first, [rows - 2])[0]["i"] == rows - 2


def test_threads_reading_more_jsonl_shards_than_stay_open_read_each_row_from_its_own(
    tmp_path: Path,
) -> None:
    """The read kept the descriptor's number, not the file: another thread evicting the shard
    closed it, and the next shard opened took the number, so rows came from other shards (or
    'Bad file descriptor', or a false 'cut short')."""
    import random
    import threading

    from zephon_torch.io.jsonl import JsonlReader

    paths = []
    for shard in range(24):
        path = tmp_path / f"s{shard:02d}.jsonl"
        path.write_text("".join(json.dumps({"s": shard, "r": r}) + "\n" for r in range(100)))
        paths.append(str(path))
    reader = JsonlReader(dataset="d", index_cache_dir=str(tmp_path / "idx"), max_open=2)
    for path in paths:
        reader.num_rows(path)
    wrong: list[tuple[int, int, Any]] = []

    def read(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(1500):
            shard = rng.randrange(len(paths))
            rows = sorted(rng.sample(range(100), 3))
            try:
                got = [(row["s"], row["r"]) for row in reader.read(paths[shard], rows)]
            except Exception as error:
                wrong.append((shard, -1, repr(error)))
                continue
            wrong.extend((shard, r, g) for r, g in zip(rows, got) if g != (shard, r))

    threads = [threading.Thread(target=read, args=(seed,)) for seed in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []


def test_a_jsonl_shard_rewritten_in_place_is_named_as_changed_not_misread(tmp_path: Path) -> None:
    """Repaired in place (longer now), a shard kept its old line index in a reader that had
    read it: the old line spans cut the new lines, and the error blamed a sound row."""
    from zephon_torch.io.jsonl import JsonlReader

    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(50)))
    reader = JsonlReader(dataset="d", index_cache_dir=str(tmp_path / "idx"))
    assert reader.read(str(path), [49]) == [{"i": 49}]
    with open(path, "r+") as handle:  # in place: the same inode, longer lines
        handle.write("".join(json.dumps({"i": i, "fixed": True}) + "\n" for i in range(50)))
    with pytest.raises(DataError, match="was rewritten or appended to") as caught:
        reader.read(str(path), [33])
    assert (caught.value.shard, caught.value.row) == (str(path), None)
    fresh = JsonlReader(dataset="d", index_cache_dir=str(tmp_path / "idx"))
    assert fresh.read(str(path), [33]) == [{"i": 33, "fixed": True}]


def test_a_jsonl_shard_copied_over_with_the_same_size_is_named_as_changed(tmp_path: Path) -> None:
    """`cp` over a shard keeps its inode, and a file of the same size passed the check: the
    other file's rows came back as this shard's."""
    import shutil
    import time

    from zephon_torch.io.jsonl import JsonlReader

    path, other = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    path.write_text("".join(json.dumps({"t": "a" * 4, "i": i}) + "\n" for i in range(50)))
    other.write_text("".join(json.dumps({"t": "b" * 4, "i": i}) + "\n" for i in range(50)))
    reader = JsonlReader(dataset="d", index_cache_dir=str(tmp_path / "idx"))
    assert reader.read(str(path), [7]) == [{"t": "aaaa", "i": 7}]
    time.sleep(0.05)  # past the file system's clock tick: the copy's mtime differs
    shutil.copyfile(other, path)  # in place: same inode, same size
    with pytest.raises(DataError, match=r"rewritten \(its modification time moved\)"):
        reader.read(str(path), [7])


def _read_ids(dataset: Any, out: Any) -> None:
    try:
        out.put([row["i"] for row in dataset.read_rows(0, [0, 1, 2])])
    except DataError as error:
        out.put(str(error))


def test_a_jsonl_shard_rewritten_after_the_open_is_named_as_changed_in_a_spawned_copy(
    tmp_path: Path,
) -> None:
    """A pickled dataset (spawned DataLoader workers, runner='processes') dropped the shards'
    identities taken at the open: its copy took the rewritten file for the first one and read
    its rows as the shard's, while the opening process refused them."""
    import multiprocessing

    from zephon_torch.io import Dataset

    path = tmp_path / "d" / "a.jsonl"
    path.parent.mkdir()
    path.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(3)))
    dataset = Dataset.from_path("d", path.parent, index_cache_dir=str(tmp_path / "idx"))
    assert dataset.num_rows == 3
    path.write_text("".join(json.dumps({"i": 1000 + i}) + "\n" for i in range(3)))
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    child = context.Process(target=_read_ids, args=(dataset, out))
    child.start()
    until_ready_while_alive(lambda: not out.empty(), child)
    got = out.get(timeout=10)
    child.join(timeout=60)
    assert "the shard file was rewritten or appended to" in got, got
    with pytest.raises(DataError, match="the shard file was rewritten or appended to"):
        dataset.read_rows(0, [0])
