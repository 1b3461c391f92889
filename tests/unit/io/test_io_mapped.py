"""A shard file cut short in place while it is mapped is a DataError naming it, not a SIGBUS
that kills the process (every reader that maps files: JSONL, `.npy`, MDS, LitData)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

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
    with pytest.raises(DataError, match=r"was cut to \d+ bytes while \d+ were mapped") as caught:
        dataset.read_rows(0, [last])
    assert (caught.value.dataset, caught.value.shard) == ("d", dataset.shards[0].path)
    assert len(first) == 1


def test_a_jsonl_shard_cut_short_while_mapped_is_a_data_error_when_its_line_index_is_rebuilt(
    tmp_path: Path,
) -> None:
    """The line index left the reader's memory before the map did: rebuilding it (the file's
    size changed, so the cached index is not reused) must not scan the stale map."""
    from zephon_torch.io.jsonl import JsonlReader

    shards = [tmp_path / f"{name}.jsonl" for name in "abc"]
    for shard in shards:
        lines = (json.dumps({"text": "x" * 90, "i": i}) + "\n" for i in range(2000))
        shard.write_text("".join(lines))
    index_dir = str(tmp_path / "idx")
    for shard in shards:  # the line indexes on disk
        JsonlReader(dataset="d", index_cache_dir=index_dir).num_rows(str(shard))
    reader = JsonlReader(dataset="d", index_cache_dir=index_dir, max_open=2)
    first, second, third = (str(shard) for shard in shards)
    reader.read(first, [0])  # mapped; its index from disk
    reader.num_rows(second)
    reader.num_rows(third)  # the first shard's index leaves the LRU, its map stays
    with open(first, "r+b") as handle:
        handle.truncate(os.path.getsize(first) // 2)
    for call in (lambda: reader.num_rows(first), lambda: reader.read(first, [0])):
        cut = r"was cut to \d+ bytes while \d+ were mapped"
        with pytest.raises(DataError, match=cut) as caught:
            call()
        assert (caught.value.dataset, caught.value.shard) == ("d", first)
