"""An MDS shard's token column read in bulk (each sample's array place found once for the whole
shard, ``ShardArrays``; a request then slices) gives exactly what the per-sample decoder gives,
over random layouts written by MDSWriter: variable and fixed-size columns before and after the
array, its dtype, a stated shape or one per sample (shape headers of 1, 2 and 4 bytes), odd
byte shifts, zstd, shards of one sample, requests of any size and order, repeats, threads."""

from __future__ import annotations

import random
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.io.test_io_formats_writers import write_mds
from zephon_torch.io import Dataset
from zephon_torch.io.mds import MdsReader

# other columns: their encoding, and a value of the i-th row (variable and fixed sizes)
OTHERS: dict[str, Any] = {
    "str": lambda i: "x" * (i % 5),
    "bytes": lambda i: bytes(i % 3),
    "int": lambda i: i,
    "uint8": lambda i: i % 256,
    "int16": lambda i: -i,
    "ndarray:float32": lambda i: np.ones(1 + i % 3, np.float32),
    "ndarray:uint8:3": lambda i: np.array([1, 2, 3], np.uint8),
    "json": lambda i: {"i": i},
}
DTYPES = ["uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64"]

layouts = st.fixed_dictionaries(
    {
        "before": st.lists(st.sampled_from(sorted(OTHERS)), max_size=3, unique=True),
        "after": st.lists(st.sampled_from(sorted(OTHERS)), max_size=2, unique=True),
        "dtype": st.sampled_from(DTYPES),
        "shape": st.none() | st.integers(1, 9),  # a stated shape: every array that long
        # shape headers of 1 and 2 bytes (lengths up to 300), and of 4 (one of 65,537)
        "lengths": st.lists(st.integers(1, 300), min_size=1, max_size=45),
        "huge": st.booleans(),
        "compression": st.sampled_from([None, "zstd"]),
        "size_limit": st.sampled_from([1 << 11, 1 << 26]),
    }
)


def write(out: Path, layout: dict[str, Any]) -> list[np.ndarray[Any, Any]]:
    """A dataset of ``layout`` (token column ``tok``); returns each row's ids, in order."""
    dtype, shape = np.dtype(layout["dtype"]), layout["shape"]
    lengths = [shape] * len(layout["lengths"]) if shape else list(layout["lengths"])
    if layout["huge"] and not shape:
        lengths[len(lengths) // 2] = 65_537
    high = min(int(np.iinfo(dtype).max), 2**40)
    ids = [(np.arange(n, dtype=np.int64) * 7919 + 31 * i) % high for i, n in enumerate(lengths)]
    low = high // 2 if dtype.kind == "i" else 0  # signed ids below zero too
    ids = [(array - low).astype(dtype) for array in ids]
    columns = {f"b{k}": encoding for k, encoding in enumerate(layout["before"])}
    columns["tok"] = f"ndarray:{dtype.name}" + (f":{shape}" if shape else "")
    columns |= {f"a{k}": encoding for k, encoding in enumerate(layout["after"])}
    rows = []
    for i, array in enumerate(ids):
        row = {name: OTHERS[encoding](i) for name, encoding in columns.items() if name != "tok"}
        rows.append({**row, "tok": array})
    write_mds(
        out, rows, columns, compression=layout["compression"], size_limit=layout["size_limit"]
    )
    return ids


def _refuse_decoding(*_: Any) -> None:
    raise AssertionError("decoded sample by sample")


@settings(max_examples=60, deadline=None)
@given(layout=layouts, rng=st.randoms(use_true_random=False))
def test_bulk_reads_give_what_the_per_sample_decoder_gives(
    layout: dict[str, Any], rng: random.Random
) -> None:
    with tempfile.TemporaryDirectory() as folder, pytest.MonkeyPatch.context() as patch:
        ids = write(Path(folder) / "mds", layout)
        every = Dataset.from_path("m", Path(folder) / "mds")  # no single array: per sample
        fast = Dataset.from_path("m", Path(folder) / "mds", columns=["tok"])
        first = 0
        for shard, info in enumerate(fast.shards):
            count = info.num_rows
            patch.undo()  # `every` decodes sample by sample
            decoded = [row["tok"] for row in every.read_rows(shard, range(count))]
            assert [a.tolist() for a in decoded] == [a.tolist() for a in ids[first:][:count]]
            first += count
            # a request of 32 rows or more finds the shard's places (repeats count)
            asks = [[rng.randrange(count) for _ in range(rng.choice([32, 40]))]]
            asks += [[rng.randrange(count) for _ in range(rng.choice([1, 2, 5, 33]))]] * 6
            for k, ask in enumerate(asks):
                arrays = fast.read_tokens(shard, ask, "tok")
                rows = fast.read_rows(shard, ask)
                assert arrays is not None
                for array, row, i in zip(arrays, rows, ask, strict=True):
                    assert array.dtype == row["tok"].dtype == decoded[i].dtype
                    assert array.tolist() == row["tok"].tolist() == decoded[i].tolist()
                    assert not array.flags.writeable
                if k == 0:  # found: from now on nothing is decoded sample by sample
                    patch.setattr(MdsReader, "_decoded", _refuse_decoding)


@pytest.mark.parametrize(
    "layout",
    [
        {"before": ["str", "uint8"], "after": ["json"], "dtype": "int32", "shape": None},
        {"before": ["bytes"], "after": [], "dtype": "uint16", "shape": None},
        {"before": ["int16"], "after": ["str"], "dtype": "int64", "shape": 5},
    ],
)
@pytest.mark.parametrize("compression", [None, "zstd"])
def test_threads_finding_a_shards_places_at_once_read_what_one_thread_reads(
    tmp_path: Path, layout: dict[str, Any], compression: str | None
) -> None:
    """Eight threads asking a fresh dataset's shards at once (each shard's places found by
    whichever thread gets there, perhaps by several) read the ids one thread reads."""
    lengths = [1 + (i * 37) % 290 for i in range(150)]
    settings_ = {**layout, "lengths": lengths, "huge": False, "compression": compression}
    ids = write(tmp_path / "mds", {**settings_, "size_limit": 1 << 12})
    dataset = Dataset.from_path("m", tmp_path / "mds", columns=["tok"])
    firsts = np.cumsum([0] + [info.num_rows for info in dataset.shards]).tolist()
    rng = random.Random(0)
    work = []
    for _ in range(400):
        shard = rng.randrange(len(dataset.shards))
        size = rng.choice([1, 3, 32, 50])
        work.append((shard, [rng.randrange(dataset.shards[shard].num_rows) for _ in range(size)]))

    def read(ask: tuple[int, list[int]]) -> list[list[int]]:
        arrays = dataset.read_tokens(ask[0], ask[1], "tok")
        assert arrays is not None
        return [array.tolist() for array in arrays]

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(read, work))
    assert got == [[ids[firsts[shard] + i].tolist() for i in rows] for shard, rows in work]
