"""Stored token views against the rows path, format by format: encodings, projections,
compression, EOS, corrupt samples, eviction, remote copies, and remote formats that store no
views (no extra shard opens)."""

from __future__ import annotations

import gc
import uuid
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.unit.io.test_io_formats_writers import tokens_loader, write_litdata, write_mds
from zephon_torch.errors import DataError
from zephon_torch.io import Dataset
from zephon_torch.ops.columns import TokenChain
from zephon_torch.ops.fetch import read_token_span
from zephon_torch.work.pointers import PointerSpan

TOKENS = "input_ids"


def _put(local: Path) -> str:
    root = f"/views-{uuid.uuid4().hex[:8]}"
    fsspec.filesystem("memory").put(str(local), root, recursive=True)
    return f"memory://{root}"


def _options(tmp_path: Path, max_bytes: int = 1 << 22) -> dict[str, Any]:
    return {"cache": {"dir": str(tmp_path / "cache"), "max_bytes": max_bytes}}


def _span(dataset: Dataset, seed: int = 0) -> PointerSpan:
    pairs = [(s, r) for s, shard in enumerate(dataset.shards) for r in range(shard.num_rows)]
    order = np.random.default_rng(seed).permutation(len(pairs))
    shards = np.array([pairs[i][0] for i in order], dtype=np.int64)
    rows = np.array([pairs[i][1] for i in order], dtype=np.int64)
    return PointerSpan(0, 0, shards, rows)


def _both(dataset: Dataset, field: str, eos: int | None, monkeypatch: pytest.MonkeyPatch) -> Any:
    """(chunk or error from views, chunk or error from rows)."""
    span = _span(dataset)
    chain = TokenChain((dataset,), field, eos)

    def attempt() -> Any:
        try:
            chunk = chain(0, span)
        except DataError as error:
            return ("error", str(error))
        return [(t.dtype.str, t.tolist()) for t in chunk.tokens]

    views = attempt()
    with monkeypatch.context() as patch:
        patch.setattr(Dataset, "read_tokens", lambda *_: None)
        rows = attempt()
    return views, rows


def _docs(count: int, dtype: Any = np.int32, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)  # the MDS writer refuses empty arrays
    return [rng.integers(0, 1000, int(rng.integers(1, 30))).astype(dtype) for _ in range(count)]


# --- remote parquet: read_tokens downloads/opens the shard only to give None ----------------


def test_remote_parquet_cache_counters_are_not_inflated_by_read_tokens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = _docs(200)
    folder = tmp_path / "pq"
    folder.mkdir()
    for part in range(4):
        table = pa.table(
            {TOKENS: pa.array([d.tolist() for d in docs[part::4]], pa.list_(pa.int32()))}
        )
        pq.write_table(table, folder / f"{part}.parquet")
    url = _put(folder)

    def counters(patched: bool) -> dict[str, int]:
        remote = Dataset.from_path(
            "pq", url, token_columns=[TOKENS], io_options=_options(tmp_path / str(patched))
        )
        chain = TokenChain((remote,), TOKENS, None)
        with monkeypatch.context() as patch:
            if patched:
                patch.setattr(Dataset, "read_tokens", lambda *_: None)
            for _ in range(3):
                chain(0, _span(remote))
        found = remote.cache_counters()
        assert found is not None
        return found

    assert counters(False) == counters(True)


# --- MDS ----------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_mds_untyped_shape_2d_samples_fall_back_and_name_the_row(
    tmp_path: Path, compression: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [{TOKENS: np.arange(i % 5 + 1, dtype=np.int32)} for i in range(80)]
    rows[45] = {TOKENS: np.zeros((2, 3), dtype=np.int32)}
    dataset = Dataset.from_path(
        "m", write_mds(tmp_path / "m", rows, {TOKENS: "ndarray:int32"}, compression=compression)
    )
    assert dataset.read_tokens(0, range(80), TOKENS) is None
    assert dataset.read_tokens(0, [45], TOKENS) is None
    views, from_rows = _both(dataset, TOKENS, None, monkeypatch)
    assert views == from_rows and views[0] == "error" and "row 45" in views[1], views


@pytest.mark.parametrize(
    "encoding", ["ndarray:float32", "ndarray", "ndarray:uint16", "ndarray:int64:4"]
)
@pytest.mark.parametrize("eos", [None, 7])
def test_mds_token_encodings_views_equal_rows(
    tmp_path: Path, encoding: str, eos: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    dtype = {"ndarray:float32": np.float32, "ndarray:uint16": np.uint16}.get(encoding, np.int64)
    fixed = encoding.endswith(":4")
    rows = [
        {TOKENS: (np.arange(4) if fixed else np.arange(i % 7 + 1)).astype(dtype) + i}
        for i in range(70)
    ]
    dataset = Dataset.from_path(
        "m", write_mds(tmp_path / "m", rows, {TOKENS: encoding}, size_limit=1 << 10)
    )
    views, from_rows = _both(dataset, TOKENS, eos, monkeypatch)
    assert views == from_rows
    if encoding == "ndarray:float32":
        assert views[0] == "error"


@pytest.mark.parametrize("compression", [None, "zstd"])
@pytest.mark.parametrize("columns", [None, [TOKENS], [TOKENS, "text"]])
def test_mds_multi_column_views_equal_rows(
    tmp_path: Path,
    compression: str | None,
    columns: list[str] | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rows = [{"text": f"t{i}", TOKENS: d, "n": i} for i, d in enumerate(_docs(150))]
    out = write_mds(
        tmp_path / "m",
        rows,
        {"text": "str", TOKENS: "ndarray:int32", "n": "int"},
        compression=compression,
        size_limit=1 << 11,
    )
    dataset = Dataset.from_path("m", out, columns=columns)
    assert len(dataset.shards) > 1
    got = dataset.read_tokens(0, range(dataset.shards[0].num_rows), TOKENS)
    assert (got is not None) == (columns == [TOKENS])
    views, from_rows = _both(dataset, TOKENS, None, monkeypatch)
    assert views == from_rows and views[0] != "error"


def test_mds_corrupt_sample_through_the_chain_names_dataset_shard_row(tmp_path: Path) -> None:
    rows = [{TOKENS: np.arange(i % 5 + 1, dtype=np.int32)} for i in range(50)]
    out = write_mds(tmp_path / "m", rows, {TOKENS: "ndarray:int32"})
    shard = next(out.glob("*.mds"))
    data = bytearray(shard.read_bytes())
    count = int(np.frombuffer(bytes(data[:4]), "<u4")[0])
    offsets = np.frombuffer(bytes(data[4 : 4 + 4 * (count + 1)]), "<u4")
    start = int(offsets[3])
    data[start + 4] = 0xFF  # the shape byte of sample 3
    shard.write_bytes(bytes(data))
    dataset = Dataset.from_path("m", out)
    chain = TokenChain((dataset,), TOKENS, None)
    for rows_asked in (list(range(50)), [3]):
        span = PointerSpan(0, 0, np.zeros(len(rows_asked), np.int64), np.array(rows_asked))
        with pytest.raises(DataError, match=r"dataset 'm'.*shard\.00000\.mds.*row 3"):
            chain(0, span)


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_mds_views_outlive_eviction_from_the_readers_caches(
    tmp_path: Path, compression: str | None
) -> None:
    docs = _docs(400, seed=5)
    rows = [{TOKENS: d} for d in docs]
    out = write_mds(
        tmp_path / "m", rows, {TOKENS: "ndarray:int32"}, compression=compression, size_limit=1 << 10
    )
    dataset = Dataset.from_path("m", out)
    reader = dataset._reader  # type: ignore[attr-defined]
    reader.max_open = reader.max_decompressed = 1
    reader._open_caches()
    held = dataset.read_tokens(0, range(dataset.shards[0].num_rows), TOKENS)
    assert held is not None
    for shard in range(1, len(dataset.shards)):
        dataset.read_tokens(shard, range(dataset.shards[shard].num_rows), TOKENS)
    gc.collect()
    assert [h.tolist() for h in held] == [d.tolist() for d in docs[: len(held)]]


# --- LitData ------------------------------------------------------------------------------


def _dict_item(doc: np.ndarray) -> dict[str, Any]:
    return {TOKENS: doc, "n": 1}


def test_litdata_pytree_items_give_no_views_and_equal_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = _docs(60)
    out = write_litdata(tmp_path / "lit", docs, fn=_dict_item, chunk_bytes=1 << 11)
    dataset = Dataset.from_path("lit", out, token_columns=[TOKENS])
    assert dataset.read_tokens(0, [0, 1], TOKENS) is None
    views, from_rows = _both(dataset, TOKENS, 3, monkeypatch)
    assert views == from_rows and views[0] != "error"


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_litdata_tokens_loader_views_equal_rows(
    tmp_path: Path, compression: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = [d for d in _docs(120, dtype=np.uint16) if len(d)]
    extra = (
        {} if compression is None else {"compression": compression, "compression_level": "chunk"}
    )
    out = write_litdata(
        tmp_path / "lit", docs, chunk_bytes=1 << 10, item_loader=tokens_loader(), **extra
    )
    dataset = Dataset.from_path("lit", out)
    for eos in (None, 70_000):
        views, from_rows = _both(dataset, TOKENS, eos, monkeypatch)
        assert views == from_rows and views[0] != "error"


def test_litdata_views_outlive_eviction(tmp_path: Path) -> None:
    docs = [d for d in _docs(300, seed=9) if len(d)]
    out = write_litdata(tmp_path / "lit", docs, chunk_bytes=1 << 10, item_loader=tokens_loader())
    dataset = Dataset.from_path("lit", out)
    reader = dataset._reader  # type: ignore[attr-defined]
    reader.max_open = 1
    reader._open_caches()
    held = dataset.read_tokens(0, range(dataset.shards[0].num_rows), TOKENS)
    assert held is not None
    for shard in range(1, len(dataset.shards)):
        dataset.read_tokens(shard, range(dataset.shards[shard].num_rows), TOKENS)
    gc.collect()
    assert [h.tolist() for h in held] == [d.tolist() for d in docs[: len(held)]]


# --- npy ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.uint16, np.int64, ">i4"])
def test_npy_2d_and_1d_views_equal_rows_with_eos(
    tmp_path: Path, dtype: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    grid = tmp_path / "grid"
    grid.mkdir()
    np.save(grid / "0.npy", np.arange(60, dtype=dtype).reshape(10, 6))
    np.save(grid / "1.npy", np.arange(12, dtype=dtype).reshape(2, 6))
    dataset = Dataset.from_path("g", grid)
    for eos in (None, 5, 70_000):
        views, from_rows = _both(dataset, TOKENS, eos, monkeypatch)
        assert views == from_rows
    views, from_rows = _both(dataset, "tokens", None, monkeypatch)  # a wrong field
    assert views == from_rows and views[0] == "error"


# --- remote MDS / LitData -------------------------------------------------------------------


def test_remote_mds_and_litdata_views_equal_local(tmp_path: Path) -> None:
    docs = [d for d in _docs(200, seed=11) if len(d)]
    mds = write_mds(
        tmp_path / "m", [{TOKENS: d} for d in docs], {TOKENS: "ndarray:int32"}, size_limit=1 << 10
    )
    lit = write_litdata(tmp_path / "lit", docs, chunk_bytes=1 << 10, item_loader=tokens_loader())
    for out in (mds, lit):
        local = Dataset.from_path("d", out)
        remote = Dataset.from_path(
            "d", _put(out), io_options=_options(tmp_path / out.name, 1 << 14)
        )
        span = _span(local)
        got = read_token_span(remote, span.shards, span.rows, TOKENS)
        want = read_token_span(local, span.shards, span.rows, TOKENS)
        assert got is not None and want is not None
        assert [g.tolist() for g in got] == [w.tolist() for w in want]


# --- which views are of mapped files ---------------------------------------------------------


def test_maps_token_ids_only_where_every_shard_is_a_local_map(tmp_path: Path) -> None:
    """`Dataset.maps_token_ids` (chunks of such views may grow without a token cap): `.npy`
    files and uncompressed MDS and LitData shards on local disk; not compressed shards, which
    are decoded, formats that give no views, nor remote copies in the shard cache."""
    docs = [d for d in _docs(60, seed=3) if len(d)]
    npy = tmp_path / "npy"
    npy.mkdir()
    np.save(npy / "0.npy", np.concatenate(docs))
    np.save(npy / "0.offsets.npy", np.cumsum([0] + [len(d) for d in docs]))
    rows = [{TOKENS: d} for d in docs]
    mds = {
        codec: write_mds(
            tmp_path / f"m-{codec}", rows, {TOKENS: "ndarray:int32"}, compression=codec
        )
        for codec in (None, "zstd")
    }
    lit = {
        codec: write_litdata(
            tmp_path / f"lit-{codec}",
            docs,
            chunk_bytes=1 << 10,
            item_loader=tokens_loader(),
            **({} if codec is None else {"compression": codec, "compression_level": "chunk"}),
        )
        for codec in (None, "zstd")
    }
    table = pa.table({TOKENS: pa.array([d.tolist() for d in docs], type=pa.list_(pa.int32()))})
    (tmp_path / "pq").mkdir()
    pq.write_table(table, tmp_path / "pq" / "t.parquet")
    expected = {
        "npy": (npy, True),
        "mds": (mds[None], True),
        "mds-zstd": (mds["zstd"], False),
        "litdata": (lit[None], True),
        "litdata-zstd": (lit["zstd"], False),
        "parquet": (tmp_path / "pq", False),
    }
    for name, (path, mapped) in expected.items():
        local = Dataset.from_path(name, path)
        assert local.maps_token_ids() is mapped, name
        if mapped:  # the same views, mapped
            span = _span(local)
            got = read_token_span(local, span.shards, span.rows, TOKENS)
            assert got is not None and len(got) == len(docs)
        remote = Dataset.from_path(name, _put(path), io_options=_options(tmp_path / name))
        assert remote.maps_token_ids() is False, name
    assert Dataset.from_dict("d", {TOKENS: docs}).maps_token_ids() is False
