"""MDS token arrays read in bulk: a shard's sample places found once enough of it is asked for,
the same arrays as the per-sample decoder, and a sample that does not decode refused by both."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.unit.io.test_io_formats_writers import mds_writer_class, sample_rows, write_mds
from zephon_torch.errors import DataError
from zephon_torch.io import Dataset, _mds_bulk
from zephon_torch.io._mds_bulk import ShardArrays
from zephon_torch.io.mds import MdsReader


@pytest.mark.parametrize("damage", ["short_sample", "long_column", "short_shape"])
def test_a_sample_that_does_not_decode_is_a_data_error_naming_shard_and_row(
    tmp_path: Path, damage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """...and the shard's other samples are still read in bulk: its places are then found
    request by request, each request that avoids the damaged sample in one go."""
    rows = sample_rows(6)
    out = write_mds(tmp_path / "mds", rows, {"tokens": "ndarray:int32"})
    shard = out / "shard.00000.mds"
    data = bytearray(shard.read_bytes())
    count = int.from_bytes(data[:4], "little")
    offsets = np.frombuffer(bytes(data[4 : 4 * (count + 2)]), "<u4").astype(int)
    start = int(offsets[3])
    if damage == "short_sample":  # row 3 holds 2 bytes: not even its column lengths
        data[4 + 4 * 4 : 4 + 4 * 5] = (start + 2).to_bytes(4, "little")
    elif damage == "long_column":  # row 3's column says it runs past the sample
        data[start : start + 4] = (1 << 30).to_bytes(4, "little")
    else:  # row 3's array says 63 dimensions of 8 bytes: its shape runs past the sample
        data[start + 4] = (63 << 2) | 3
    shard.write_bytes(bytes(data))
    dataset = Dataset.from_path("m", out)
    assert len(dataset.read_rows(0, [2])) == 1
    assert len(dataset.read_rows(0, [2] * 40)) == 40  # a request the bulk path takes
    for request in ([3], [2] * 40 + [3]):  # sample by sample, and bulk falling back
        with pytest.raises(
            DataError, match=r"dataset 'm'.*shard\.00000\.mds.*row 3.*does not decode"
        ):
            dataset.read_rows(0, request)
        with pytest.raises(DataError, match=r"shard\.00000\.mds.*row 3.*does not decode"):
            dataset.read_tokens(0, request, "tokens")  # as views of the stored ids
    monkeypatch.setattr(MdsReader, "_decoded", _refuse_decoding)
    others = [0, 1, 2, 5] * 10  # short_sample moved row 4's start too
    arrays = dataset.read_tokens(0, others, "tokens")
    assert arrays is not None
    assert [a.tolist() for a in arrays] == [rows[i]["tokens"].tolist() for i in others]
    with pytest.raises(AssertionError, match="decoded sample by sample"):
        dataset.read_tokens(0, [0, 1, 2, 5], "tokens")  # short: no bulk read of its own


def _refuse_decoding(*_: Any) -> None:
    raise AssertionError("decoded sample by sample")


def test_once_a_shard_is_read_in_bulk_its_short_requests_are_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first request of 32 rows or more finds every sample's array in the shard; from
    then on a request of any size is read in bulk (a chunk's few rows of a shard, a resumed
    document), not decoded sample by sample, and gives the same arrays."""
    rows = sample_rows(40)
    out = write_mds(tmp_path / "mds", rows, {"text": "str", "tokens": "ndarray:int32"})
    dataset = Dataset.from_path("m", out, columns=["tokens"])
    every = dataset.read_tokens(0, list(range(40)), "tokens")
    assert every is not None
    monkeypatch.setattr(MdsReader, "_decoded", _refuse_decoding)
    for request in ([7], [39, 0, 7], [5, 5]):
        arrays = dataset.read_tokens(0, request, "tokens")
        assert arrays is not None
        assert [a.tolist() for a in arrays] == [rows[i]["tokens"].tolist() for i in request]
        assert all(not a.flags.writeable for a in arrays)


@pytest.mark.parametrize("compression", [None, "zstd"])
@pytest.mark.parametrize(
    "columns",
    [
        {"tokens": "ndarray:int32"},
        {"text": "str", "tokens": "ndarray:uint16", "id": "int"},
        {"a": "int32", "b": "ndarray:int64", "tokens": "ndarray:int32", "z": "str"},
        {"tokens": "ndarray:int32:7", "text": "str"},
        {"text": "str", "tokens": "ndarray:uint8"},
    ],
    ids=["alone", "between", "after-fixed-and-array", "fixed-shape", "bytes-wide"],
)
def test_one_array_column_read_in_bulk_equals_the_per_sample_decoder(
    tmp_path: Path, columns: dict[str, str], compression: str | None
) -> None:
    """A row keeping a single 1-D array column is read for a whole request at once; rows
    keeping more columns decode sample by sample. Both give the same arrays, for lengths
    across the shape's size codes (under 256, under 65,536, above) and rows starting at every
    byte shift (the strings before them have odd lengths)."""
    rng = np.random.default_rng(7)
    fixed = columns["tokens"].count(":") == 2
    lengths = [1, 255, 256, 300, 65535, 65536, 70000, *rng.integers(1, 600, 40).tolist()]
    dtype_of = {name: enc.split(":")[1] for name, enc in columns.items() if ":" in enc}
    rows = []
    for i, length in enumerate(lengths):
        row: dict[str, Any] = {}
        for name, encoding in columns.items():
            if encoding.startswith("ndarray"):
                size = (7 if fixed else length) if name == "tokens" else i % 5 + 1
                row[name] = rng.integers(0, 200, size, dtype=dtype_of[name])
            else:
                row[name] = "x" * (i % 7) if encoding == "str" else i
        rows.append(row)
    out = write_mds(tmp_path / "mds", rows, columns, compression=compression, size_limit=1 << 18)
    bulk = Dataset.from_path("m", out, columns=["tokens"], token_columns=["tokens"])
    both = [*columns] if len(columns) > 1 else None  # alone: against the rows written only
    single = Dataset.from_path("m", out, columns=both, token_columns=["tokens"])
    info = bulk._reader._infos[bulk.shards[0].path]  # type: ignore[attr-defined]
    assert info.layout.one_array is not None  # the bulk path is the one under test
    fast: list[Any] = []
    slow: list[Any] = []
    for number, shard in enumerate(bulk.shards):
        picked = [*rng.permutation(shard.num_rows).tolist(), 0, 0]
        fast += bulk.read_rows(number, picked)
        slow += single.read_rows(number, picked)
    assert len(fast) == len(slow) == len(rows) + 2 * len(bulk.shards)
    assert {got["tokens"].dtype for got in fast} == {np.dtype(dtype_of["tokens"])}
    for got, want in zip(fast, slow, strict=True):
        if both is None:
            break
        assert got["tokens"].dtype == want["tokens"].dtype
        assert np.array_equal(got["tokens"], want["tokens"])
        assert not got["tokens"].flags.writeable
    every = [
        tuple(row["tokens"].tolist())
        for number, shard in enumerate(bulk.shards)
        for row in bulk.read_rows(number, range(shard.num_rows))
    ]
    assert every == [tuple(row["tokens"].tolist()) for row in rows]


@pytest.mark.parametrize("dtype", ["int16", "int32"])
def test_a_shape_of_two_to_the_63_is_a_data_error_not_an_empty_array(
    tmp_path: Path, dtype: str
) -> None:
    """Read as int64, an 8-byte dimension of 2**63 + n is negative, and its product with the
    item size wraps around to the column's size: the bulk path must refuse it like the
    per-sample decoder does."""
    rows = [{"tokens": np.arange(i + 3, dtype=dtype)} for i in range(6)]
    out = write_mds(tmp_path / "mds", rows, {"tokens": f"ndarray:{dtype}"})
    shard = out / "shard.00000.mds"
    data = bytearray(shard.read_bytes())
    count = int.from_bytes(data[:4], "little")
    offsets = np.frombuffer(bytes(data[4 : 4 * (count + 2)]), "<u4").astype(int)
    start, end = int(offsets[3]), int(offsets[4])
    itemsize = np.dtype(dtype).itemsize
    values = 8  # the sample keeps its length: a u8 dimension and 8 values
    sample = (
        (1 + 8 + values * itemsize).to_bytes(4, "little")
        + bytes([(1 << 2) | 3])
        + (values + 2**63).to_bytes(8, "little")
        + bytes(values * itemsize)
    )
    data[start:end] = sample
    grown = len(sample) - (end - start)
    table = bytearray(data[4 : 4 * (count + 2)])
    moved = np.frombuffer(bytes(table), "<u4").astype(np.int64)
    moved[4:] += grown
    data[4 : 4 * (count + 2)] = moved.astype("<u4").tobytes()
    shard.write_bytes(bytes(data))
    index = json.loads((out / "index.json").read_text())
    index["shards"][0]["raw_data"]["bytes"] = len(data)
    (out / "index.json").write_text(json.dumps(index))
    dataset = Dataset.from_path("m", out, token_columns=["tokens"])
    assert len(dataset.read_rows(0, [2, 4] * 20)) == 40  # the bulk path
    with pytest.raises(DataError, match=r"dataset 'm'.*row 3.*does not decode"):
        dataset.read_rows(0, [2] * 40 + [3])
    with pytest.raises(DataError, match=r"dataset 'm'.*row 3.*does not decode"):
        dataset.read_tokens(0, [2] * 40 + [3], "tokens")


def test_an_index_that_says_less_of_a_sample_than_it_holds_is_a_data_error(
    tmp_path: Path,
) -> None:
    """An index stating 3 int32 ids a sample where 4 are stored (an index of another write)
    cut every document's last id, by the bulk path and by the per-sample decoder alike. The
    shard's own copy of its columns says 3 too here (else the shard is refused when loaded,
    see the next test), so that the samples' own check is what is tested."""
    with mds_writer_class()(out=str(tmp_path), columns={"tok": "ndarray:int32:4"}) as writer:
        for i in range(40):
            writer.write({"tok": np.arange(4, dtype=np.int32) + i})
    index = json.loads((tmp_path / "index.json").read_text())
    index["shards"][0]["column_encodings"] = ["ndarray:int32:3"]
    index["shards"][0]["column_sizes"] = [12]
    (tmp_path / "index.json").write_text(json.dumps(index))
    shard = tmp_path / "shard.00000.mds"
    stored = shard.read_bytes()
    shard.write_bytes(
        stored.replace(b'"ndarray:int32:4"', b'"ndarray:int32:3"', 1).replace(
            b'"column_sizes": [16]', b'"column_sizes": [12]', 1
        )
    )
    dataset = Dataset.from_path("m", tmp_path)
    said = r"row 0: sample does not decode: .*take 12 bytes, but it holds 16"
    with pytest.raises(DataError, match=said):
        dataset.read_rows(0, [0, 1])
    with pytest.raises(DataError, match=said):
        dataset.read_tokens(0, list(range(40)), "tok")  # the bulk path, then the decoder


@pytest.mark.parametrize("compiled", [True, False])
def test_a_shard_s_places_are_found_at_once_only_after_a_share_of_it_was_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compiled: bool
) -> None:
    """Finding every sample's array place pays for a process that reads much of the shard; one
    reading one lane of many (a few rows of each shard) paid for all of them (with numpy, 32
    ms for 300,000 samples, for 4,688 rows read). Until a 64th of the shard was asked for (an
    eighth where numpy finds them, ten times slower), each request finds its own places; the
    same arrays either way."""
    if compiled:
        assert _mds_bulk._native is not None, "zephon_torch._native was not built"
    else:
        monkeypatch.setattr(_mds_bulk, "_native", None)
    share = 64 if compiled else 8
    rows = sample_rows(2_500)
    out = write_mds(tmp_path / "mds", rows, {"tokens": "ndarray:int32"}, size_limit=1 << 24)
    dataset = Dataset.from_path("m", out)
    assert len(dataset.shards) == 1
    finds: list[int] = []
    find_all = ShardArrays._find_all

    def counted(self: ShardArrays) -> Any:
        finds.append(len(self._offsets) - 1)
        return find_all(self)

    monkeypatch.setattr(ShardArrays, "_find_all", counted)
    asked = 0
    for first in range(0, 2_500, 32):  # 32 rows a request: in bulk
        request = list(range(first, min(first + 32, 2_500)))
        arrays = dataset.read_tokens(0, request, "tokens")
        assert arrays is not None
        assert [a.tolist() for a in arrays] == [rows[i]["tokens"].tolist() for i in request]
        asked += len(request)
        assert finds == ([2_500] if asked * share >= 2_500 else [])
        if finds:
            break
    assert asked == (64 if compiled else 320)  # the first 32 rows a request that reach the share
    arrays = dataset.read_tokens(0, [2_499, 0], "tokens")  # short: read in bulk once found
    assert arrays is not None and arrays[0].tolist() == rows[2_499]["tokens"].tolist()
    assert finds == [2_500]


def test_rows_keeping_one_array_beside_variable_columns_are_read_in_bulk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole-sample check of the bulk path sums the variable columns' lengths: got wrong,
    every shard with one (a str beside the tokens) would fall back to the per-sample
    decoder, 7 times slower, without a word."""
    with mds_writer_class()(
        out=str(tmp_path), columns={"text": "str", "tok": "ndarray:int32", "n": "int"}
    ) as writer:
        for i in range(40):
            writer.write({"text": "x" * i, "tok": np.arange(1 + i % 7, dtype=np.int32), "n": i})
    dataset = Dataset.from_path("m", tmp_path, columns=["tok"])

    monkeypatch.setattr(MdsReader, "_decoded", _refuse_decoding)
    arrays = dataset.read_tokens(0, list(range(40)), "tok")
    assert arrays is not None
    assert [a.tolist() for a in arrays] == [list(range(1 + i % 7)) for i in range(40)]
