"""Stored token ids handed over without row dicts (`Dataset.read_tokens`, `read_token_span`):
the same arrays as the rows' token field, or None where a format or request does not store
them so, and pre-tokenized chunks equal either way."""

from __future__ import annotations

from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.unit.io.test_io_formats_writers import tokens_loader, write_litdata, write_mds
from zephon_torch.io import Dataset
from zephon_torch.ops.columns import TokenChain
from zephon_torch.ops.fetch import read_token_span
from zephon_torch.work.pointers import PointerSpan

TOKENS = "input_ids"


def _documents(count: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 50_000, int(rng.integers(1, 40)), dtype=np.int32) for _ in range(count)]


def _write_npy(folder: Path, docs: list[np.ndarray], parts: int = 3) -> Path:
    folder.mkdir(parents=True)
    size = -(-len(docs) // parts)
    for number, start in enumerate(range(0, len(docs), size)):
        part = docs[start : start + size]
        np.save(folder / f"{number}.npy", np.concatenate(part))
        np.save(folder / f"{number}.offsets.npy", np.cumsum([0, *map(len, part)]))
    return folder


def _datasets(root: Path, docs: list[np.ndarray]) -> dict[str, Dataset]:
    """The documents stored by each token-array format (and two that store no arrays)."""
    rows = [{TOKENS: doc, "text": f"doc {i}"} for i, doc in enumerate(docs)]
    wide = {TOKENS: "ndarray:int32", "text": "str"}
    one = {TOKENS: "ndarray:int32"}
    table = pa.table({TOKENS: pa.array([d.tolist() for d in docs], pa.list_(pa.int32()))})
    (root / "parquet").mkdir()
    pq.write_table(table, root / "parquet" / "0.parquet", row_group_size=50)
    grid = root / "grid"
    grid.mkdir()
    np.save(grid / "0.npy", np.arange(6 * len(docs), dtype=np.int64).reshape(len(docs), 6))
    return {
        "npy": Dataset.from_path("npy", _write_npy(root / "npy", docs)),
        "npy-2d": Dataset.from_path("grid", grid),
        "mds": Dataset.from_path("mds", write_mds(root / "mds", rows, one, size_limit=1 << 12)),
        "mds-zstd": Dataset.from_path(
            "mdsz",
            write_mds(root / "mdsz", rows, one, compression="zstd", size_limit=1 << 12),
        ),
        "mds-projected": Dataset.from_path(
            "mdsp", write_mds(root / "mdsp", rows, wide, size_limit=1 << 13), columns=[TOKENS]
        ),
        "litdata": Dataset.from_path(
            "lit",
            write_litdata(root / "lit", docs, chunk_bytes=1 << 12, item_loader=tokens_loader()),
        ),
        "mds-wide": Dataset.from_path("mdsw", write_mds(root / "mdsw", rows, wide)),
        "parquet": Dataset.from_path("pq", root / "parquet", token_columns=[TOKENS]),
    }


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Dataset]:
    return _datasets(tmp_path_factory.mktemp("views"), _documents(300))


VIEWS = ["npy", "npy-2d", "mds", "mds-zstd", "mds-projected", "litdata"]


def _pointers(dataset: Dataset, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Every row of the dataset once, in a shuffled order across shards."""
    pairs = [(s, r) for s, shard in enumerate(dataset.shards) for r in range(shard.num_rows)]
    order = np.random.default_rng(seed).permutation(len(pairs))
    shards = np.array([pairs[i][0] for i in order], dtype=np.int64)
    rows = np.array([pairs[i][1] for i in order], dtype=np.int64)
    return shards, rows


@pytest.mark.parametrize("name", VIEWS)
def test_stored_ids_are_the_rows_token_field_in_the_order_asked(
    stored: dict[str, Dataset], name: str
) -> None:
    dataset = stored[name]
    assert len(dataset.shards) > 1 or name == "npy-2d"
    shards, rows = _pointers(dataset, seed=1)
    views = read_token_span(dataset, shards, rows, TOKENS)
    expected = [
        dataset.read_rows(shard, [row])[0][TOKENS]
        for shard, row in zip(shards.tolist(), rows.tolist(), strict=True)
    ]
    assert views is not None and len(views) == len(expected) == dataset.num_rows
    for got, want in zip(views, expected, strict=True):
        assert got.ndim == 1 and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    assert read_token_span(dataset, shards, rows, "text") is None  # another field: no views


@pytest.mark.parametrize("name", ["mds-wide", "parquet"])
def test_formats_or_layouts_without_stored_arrays_give_none(
    stored: dict[str, Dataset], name: str
) -> None:
    dataset = stored[name]
    assert dataset.read_tokens(0, range(dataset.shards[0].num_rows), TOKENS) is None


def test_mds_views_of_short_requests_are_decoded_sample_by_sample(
    stored: dict[str, Dataset],
) -> None:
    """MDS reads in bulk from 32 rows a shard; fewer are decoded one by one, still as views."""
    dataset = stored["mds"]
    shards = np.array([0] * 40 + [1] * 3, dtype=np.int64)  # 3 rows of shard 1: no bulk read
    rows = np.array([*range(40), 0, 1, 2], dtype=np.int64)
    got = read_token_span(dataset, shards, rows, TOKENS)
    expected = [dataset.read_rows(0, range(40))[r][TOKENS] for r in range(40)]
    expected += [row[TOKENS] for row in dataset.read_rows(1, [0, 1, 2])]
    assert got is not None
    assert [t.tolist() for t in got] == [t.tolist() for t in expected]


def test_a_chunk_from_views_equals_one_from_rows_with_and_without_eos(
    stored: dict[str, Dataset], monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset = stored["npy"]
    shards, rows = _pointers(dataset, seed=2)
    span = PointerSpan(0, 7, shards, rows)
    for eos in (None, 3):
        chain = TokenChain((dataset,), TOKENS, eos)
        views = chain(0, span)
        with monkeypatch.context() as patch:  # the rows path: no reader gives views
            patch.setattr(Dataset, "read_tokens", lambda *_: None)
            from_rows = chain(0, span)
        assert (views.pass_index, views.pos) == (from_rows.pass_index, from_rows.pos) == (0, 7)
        assert views.shards == from_rows.shards == shards.tolist()
        assert views.rows == from_rows.rows == rows.tolist()
        assert [t.tolist() for t in views.tokens] == [t.tolist() for t in from_rows.tokens]
        assert views.sizes == [len(t) for t in from_rows.tokens]


def test_remote_token_files_give_the_views_of_their_local_copy(
    tmp_path: Path,
) -> None:
    docs = _documents(90, seed=3)
    local = Dataset.from_path("npy", _write_npy(tmp_path / "npy", docs))
    fsspec.filesystem("memory").put(str(tmp_path / "npy"), "/views-npy", recursive=True)
    remote = Dataset.from_path(
        "npy",
        "memory:///views-npy",
        io_options={"cache": {"dir": str(tmp_path / "cache"), "max_bytes": 1 << 20}},
    )
    shards, rows = _pointers(local, seed=4)
    got = read_token_span(remote, shards, rows, TOKENS)
    want = read_token_span(local, shards, rows, TOKENS)
    assert got is not None and want is not None
    assert [t.tolist() for t in got] == [t.tolist() for t in want]
