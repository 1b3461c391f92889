"""LitData chunk directories written by litdata.optimize, read natively."""

from __future__ import annotations

import json
import pickle
import shutil
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zstandard

from tests.unit.io.test_io_formats_writers import (
    assert_threads_read_like_one,
    plain,
    sample_rows,
    tokens_loader,
    write_litdata,
)
from zephon_torch.errors import ConfigError, DataError
from zephon_torch.io import Dataset

ROWS = sample_rows(150)
TEXT_ROWS = [{"text": row["text"], "id": row["id"]} for row in ROWS]
LIST_ROWS = [{"id": row["id"], "ids": row["tokens"].tolist()} for row in ROWS]
TOKENS = [np.arange(i % 37 + 1, dtype=np.uint16) * 3 + i for i in range(150)]

# name -> (items, optimize options); each writes several chunks.
VARIANTS: dict[str, tuple[list[Any], dict[str, Any]]] = {
    "arrays": (ROWS, {}),
    "arrays-framed-zstd": (ROWS, {"compression": "zstd", "compression_batch_size": 8}),
    "arrays-chunk-zstd": (ROWS, {"compression": "zstd", "compression_level": "chunk"}),
    "arrays-item-zstd": (ROWS, {"compression": "zstd", "compression_level": "sample"}),
    "text-arrow-footer": (TEXT_ROWS, {}),
    "text-arrow-footer-zstd": (TEXT_ROWS, {"compression": "zstd"}),
}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("litdata")
    out = {
        name: write_litdata(root / name, items, chunk_bytes=2048, **options)
        for name, (items, options) in VARIANTS.items()
    }
    out["lists"] = write_litdata(root / "lists", LIST_ROWS, chunk_bytes=2048)
    out["tokens"] = write_litdata(
        root / "tokens", TOKENS, chunk_bytes=1024, item_loader=tokens_loader()
    )
    return out


@pytest.mark.parametrize("name", ["arrays", "arrays-chunk-zstd", "tokens"])
def test_chunks_without_their_index_json_are_named_as_such(
    written: dict[str, Path], tmp_path: Path, name: str
) -> None:
    """Chunks copied without the index.json litdata.optimize writes were "no known
    extension; pass `format=`"."""
    import shutil

    copy = tmp_path / "chunks"
    shutil.copytree(written[name], copy)
    (copy / "index.json").unlink()
    with pytest.raises(
        ConfigError, match=r"look like LitData shards \('chunk-0-0\.(zstd\.)?bin'\)"
    ):
        Dataset.from_path("l", copy)


def all_rows(dataset: Dataset) -> list[dict[str, Any]]:
    return [
        plain(row)
        for number, shard in enumerate(dataset.shards)
        for row in dataset.read_rows(number, range(shard.num_rows))
    ]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_litdata_directory_is_detected_and_every_item_reads_back(
    written: dict[str, Path], variant: str
) -> None:
    dataset = Dataset.from_path("l", written[variant])
    assert dataset.format == "litdata"
    assert len(dataset.shards) > 1
    assert all_rows(dataset) == [plain(row) for row in VARIANTS[variant][0]]


def test_tokens_loader_rows_are_the_token_arrays_as_written(written: dict[str, Path]) -> None:
    dataset = Dataset.from_path("l", written["tokens"])
    assert len(dataset.shards) > 1
    rows = all_rows(dataset)
    assert rows == [{"input_ids": ("<u2", tokens.tolist())} for tokens in TOKENS]
    [row] = dataset.read_rows(1, [0])
    assert row["input_ids"].dtype == np.uint16 and not row["input_ids"].flags.writeable


def test_format_litdata_opens_the_directory_and_format_mds_is_refused(
    written: dict[str, Path],
) -> None:
    path = written["arrays"]
    assert Dataset.from_path("l", path, format="litdata").shards == (
        Dataset.from_path("l", path).shards
    )
    with pytest.raises(ConfigError, match=r"`format` is 'mds' but .* holds a litdata index"):
        Dataset.from_path("l", path, format="mds")


def test_row_counts_come_from_the_index_without_reading_a_chunk(
    written: dict[str, Path], tmp_path: Path
) -> None:
    for file in written["arrays"].iterdir():
        (tmp_path / file.name).write_bytes(file.read_bytes() if file.suffix == ".json" else b"")
    dataset = Dataset.from_path("l", tmp_path)
    index = json.loads((tmp_path / "index.json").read_text())
    assert [s.num_rows for s in dataset.shards] == [c["chunk_size"] for c in index["chunks"]]
    with pytest.raises(DataError) as caught:
        dataset.read_rows(0, [0])
    assert (caught.value.dataset, caught.value.shard) == ("l", dataset.shards[0].path)


@pytest.mark.parametrize("variant", ["arrays", "text-arrow-footer-zstd"])
def test_a_projection_returns_only_the_requested_columns(
    written: dict[str, Path], variant: str
) -> None:
    dataset = Dataset.from_path("l", written[variant], columns=["id", "text"])
    assert dataset.read_rows(1, [1, 0])[0].keys() == {"id", "text"}
    assert list(dataset.read_rows(1, [1])[0]) == ["id", "text"]
    with pytest.raises(DataError) as caught:
        Dataset.from_path("l", written[variant], columns=["nope"])
    assert caught.value.detail.startswith("has no column 'nope'; its columns are")


def test_array_and_list_columns_come_back_as_token_arrays(written: dict[str, Path]) -> None:
    arrays = Dataset.from_path("l", written["arrays"], columns=["tokens"], token_columns=["tokens"])
    lists = Dataset.from_path("l", written["lists"], token_columns=["ids"])
    assert [row["tokens"].tolist() for row in arrays.read_rows(0, [3])] == [
        ROWS[3]["tokens"].tolist()
    ]
    from_lists = [row for n in range(len(lists.shards)) for row in lists.read_rows(n, [0])]
    assert all(isinstance(row["ids"], np.ndarray) for row in from_lists)
    assert from_lists[0]["ids"].tolist() == ROWS[0]["tokens"].tolist()
    with pytest.raises(DataError, match=r"token column 'text' has leaf format 'str'"):
        Dataset.from_path("l", written["arrays"], token_columns=["text"])


def test_a_token_column_of_float_arrays_is_refused_at_the_open(tmp_path: Path) -> None:
    """Float arrays were read back as a token column's arrays (MDS, Parquet and JSONL refuse
    them)."""
    items = [{"ids": np.arange(i + 1, dtype=np.float32)} for i in range(4)]
    out = write_litdata(tmp_path / "floats", items)
    assert Dataset.from_path("l", out).read_rows(0, [1])[0]["ids"].tolist() == [0.0, 1.0]
    with pytest.raises(DataError, match=r"token column 'ids' holds arrays of float32, not int"):
        Dataset.from_path("l", out, token_columns=["ids"])


def test_an_optional_field_that_no_item_of_a_chunk_has_reads_as_none(tmp_path: Path) -> None:
    items = [{"text": f"t{i}", **({"opt": f"o{i}"} if i < 4 else {})} for i in range(12)]
    out = write_litdata(tmp_path / "optional", items, chunk_bytes=None, chunk_size=4)
    dataset = Dataset.from_path("l", out)
    assert len(dataset.shards) == 3
    assert all_rows(dataset) == [{"opt": None, **item} for item in items]
    projected = Dataset.from_path("l", out, columns=["opt"])
    assert projected.read_rows(2, [0]) == [{"opt": None}]


def test_a_field_the_first_item_lacks_reads_from_the_arrow_footers(tmp_path: Path) -> None:
    items = [{"text": f"t{i}", **({"late": i} if i >= 3 else {})} for i in range(12)]
    out = write_litdata(tmp_path / "late", items, chunk_bytes=None, chunk_size=6)
    dataset = Dataset.from_path("l", out)
    assert all_rows(dataset) == [{"late": None, **item} for item in items]
    assert Dataset.from_path("l", out, columns=["late"]).read_rows(1, [0]) == [{"late": 6}]


def test_items_that_are_not_dicts_come_back_under_item(tmp_path: Path) -> None:
    items = [(f"t{i}", i) for i in range(5)]
    dataset = Dataset.from_path("l", write_litdata(tmp_path / "tuples", items))
    assert dataset.read_rows(0, range(5)) == [{"item": item} for item in items]


def test_list_and_dict_values_next_to_an_array_read_from_the_chunk_body(tmp_path: Path) -> None:
    # an array leaf keeps litdata from writing an Arrow footer: lists and dicts are "json" leaves
    # of the chunk body, in litdata's compact nested encoding
    items = [
        {
            "ids": list(range(i % 4 + 1)),
            "words": [f"w{i}", "é"][: i % 3],
            "floats": [i / 2, -1.5],
            "flags": [True, i % 2 == 0],
            "turns": [{"role": "user", "n": i, "x": None, "ok": True, "f": 0.5}],
            "mixed": [i, "a", None, [1.5]],
            "meta": {"source": f"s{i}", "tags": ["a", "b"], "deep": {"k": i}},
            "arr": np.arange(3, dtype=np.int16) + i,
        }
        for i in range(30)
    ]
    out = write_litdata(tmp_path / "body", items, chunk_bytes=1024)
    index = json.loads((out / "index.json").read_text())
    assert "json" in index["config"]["data_format"]
    dataset = Dataset.from_path("l", out)
    assert len(dataset.shards) > 1
    assert all_rows(dataset) == [plain(item) for item in items]
    tokens = Dataset.from_path("l", out, columns=["ids"], token_columns=["ids"])
    assert [row["ids"].tolist() for row in tokens.read_rows(0, [2, 1])] == [[0, 1, 2], [0, 1]]


@pytest.mark.parametrize("variant", ["arrays", "arrays-framed-zstd", "arrays-chunk-zstd"])
def test_a_truncated_chunk_raises_a_data_error_naming_dataset_and_chunk(
    written: dict[str, Path], variant: str, tmp_path: Path
) -> None:
    for file in written[variant].iterdir():
        (tmp_path / file.name).write_bytes(file.read_bytes())
    dataset = Dataset.from_path("broken", tmp_path)
    victim = Path(dataset.shards[1].path)
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size * 2 // 3])
    with pytest.raises(DataError, match=r"truncated or corrupt: .*written or copied") as caught:
        dataset.read_rows(1, [0])
    assert (caught.value.dataset, caught.value.shard) == ("broken", str(victim))
    assert len(dataset.read_rows(0, [0])) == 1


def test_an_index_listing_no_chunks_is_a_data_error_naming_it(
    written: dict[str, Path], tmp_path: Path
) -> None:
    index = json.loads((written["tokens"] / "index.json").read_text())
    index["chunks"] = []
    (tmp_path / "index.json").write_text(json.dumps(index))
    with pytest.raises(DataError, match=r"cannot read this LitData index: it lists no chunks"):
        Dataset.from_path("empty", tmp_path)


def copy_with_index(source: Path, out: Path, edit: Callable[[dict[str, Any]], object]) -> Path:
    """Copies a written dataset to `out`, applying `edit` to its parsed index.json."""
    shutil.copytree(source, out)
    index = json.loads((out / "index.json").read_text())
    edit(index)
    (out / "index.json").write_text(json.dumps(index))
    return out


@pytest.mark.parametrize("name", ["../outside.bin", "absolute"])
def test_a_chunk_name_leading_outside_the_dataset_folder_is_refused_at_open(
    written: dict[str, Path], tmp_path: Path, name: str
) -> None:
    """A chunk filename of `../x` or `/x` opened and read that file, outside the dataset
    folder."""
    first = json.loads((written["arrays"] / "index.json").read_text())["chunks"][0]
    (tmp_path / "outside.bin").write_bytes((written["arrays"] / first["filename"]).read_bytes())
    name = str(tmp_path / "outside.bin") if name == "absolute" else name
    out = copy_with_index(
        written["arrays"], tmp_path / "l", lambda index: index["chunks"][0].update(filename=name)
    )
    with pytest.raises(DataError, match=r"lies outside the dataset folder") as caught:
        Dataset.from_path("l", out)
    assert (caught.value.dataset, caught.value.shard) == ("l", str(tmp_path / "outside.bin"))


def test_a_chunk_file_listed_twice_is_refused_at_open(
    written: dict[str, Path], tmp_path: Path
) -> None:
    """An index listing one chunk file twice opened with that chunk once: fewer rows than the
    index records, silently."""
    out = copy_with_index(
        written["arrays"],
        tmp_path / "l",
        lambda index: index["chunks"][1].update(index["chunks"][0]),
    )
    with pytest.raises(DataError, match=r"lists this shard file twice \(as shards 0 and 1\)"):
        Dataset.from_path("l", out)


@pytest.mark.parametrize(("field", "what"), [("chunk_size", "items"), ("chunk_bytes", "bytes")])
def test_a_negative_item_or_byte_count_is_named_as_such(
    written: dict[str, Path], tmp_path: Path, field: str, what: str
) -> None:
    """A negative chunk_size was reported as a chunk with no rows ("an empty file, or only
    blank lines")."""
    edit = lambda index: index["chunks"][1].update({field: -1})  # noqa: E731
    out = copy_with_index(written["arrays"], tmp_path / "l", edit)
    with pytest.raises(
        DataError, match=rf"records -1 {what} for this shard, where a count"
    ) as caught:
        Dataset.from_path("l", out)
    assert caught.value.shard == str(out / "chunk-0-1.bin")


def test_an_item_count_no_chunk_can_hold_is_refused_at_open(
    written: dict[str, Path], tmp_path: Path
) -> None:
    """A chunk's header holds its count in 4 bytes. A chunk_size of 2**64 opened, then ended
    the first job to lay out its rows in a bare OverflowError (int64), naming nothing."""
    edit = lambda index: index["chunks"][1].update(chunk_size=2**64)  # noqa: E731
    out = copy_with_index(written["arrays"], tmp_path / "l", edit)
    with pytest.raises(DataError, match=r"records 18446744073709551616 items .* more than the"):
        Dataset.from_path("l", out)


@pytest.mark.parametrize("value", [None, 2, {}, ["str"]])
def test_a_data_format_entry_that_is_no_format_name_is_a_data_error_naming_the_index(
    written: dict[str, Path], tmp_path: Path, value: object
) -> None:
    """A data_format entry damaged to a number, null, a list or an object escaped as a bare
    AttributeError ('int' object has no attribute 'partition') at open."""
    edit = lambda index: index["config"]["data_format"].__setitem__(0, value)  # noqa: E731
    out = copy_with_index(written["arrays"], tmp_path / "l", edit)
    with pytest.raises(
        DataError, match=r"cannot read this LitData index: data_format is"
    ) as caught:
        Dataset.from_path("l", out)
    assert (caught.value.dataset, caught.value.shard) == ("l", str(out / "index.json"))


def nested_spec(depth: int) -> str:
    """A data_spec of items that are lists in lists, `depth` deep (written out by hand:
    json.dumps would itself recurse too deeply)."""
    leaf = '{"type": null, "context": null, "children_spec": []}'
    node = '{"type": "builtins.list", "context": "null", "children_spec": ['
    return "[1, " + node * depth + leaf + "]}" * depth + "]"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("[" * 100_000 + "]" * 100_000, "the data_spec nests too deeply to parse"),
        # deeper than JSON's parser goes in every Python: 3.13 parses 600 levels, 3.11 did not
        (nested_spec(50_000), "the data_spec nests too deeply to parse"),
        (nested_spec(200), "the data_spec nests items deeper than 100 levels"),
    ],
    ids=["json", "tree-50000", "tree-200"],
)
def test_a_data_spec_nested_too_deeply_is_a_data_error_naming_the_index(
    written: dict[str, Path], tmp_path: Path, spec: str, message: str
) -> None:
    """A data_spec nested deeper than Python's recursion goes was a bare RecursionError."""
    edit = lambda index: index["config"].update(data_spec=spec)  # noqa: E731
    out = copy_with_index(written["arrays"], tmp_path / "l", edit)
    with pytest.raises(DataError, match=f"cannot read this LitData index: {message}") as caught:
        Dataset.from_path("l", out)
    assert caught.value.shard == str(out / "index.json")


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ("", "JSONDecodeError"),
        (None, "TypeError"),
        ("[]", "ValueError"),
        ("[1, {}]", "KeyError: 'type'"),
        ('[1, {"type": "builtins.dict", "context": "{", "children_spec": []}]', "JSONDecodeError"),
    ],
    ids=["empty", "null", "no-pair", "no-type", "bad-keys"],
)
def test_a_data_spec_that_is_no_item_tree_says_so(
    written: dict[str, Path], tmp_path: Path, spec: object, error: str
) -> None:
    """A damaged or hand-written data_spec gave reasons such as "'type'" or "not enough
    values to unpack (expected 2, got 0)", not saying which part of the index was wrong."""
    edit = lambda index: index["config"].update(data_spec=spec)  # noqa: E731
    out = copy_with_index(written["arrays"], tmp_path / "l", edit)
    with pytest.raises(DataError) as caught:
        Dataset.from_path("l", out)
    assert "is not the item tree litdata.optimize writes" in str(caught.value)
    assert error in str(caught.value)
    assert caught.value.shard == str(out / "index.json")


@pytest.mark.parametrize("sized", [True, False], ids=["sized", "unsized"])
def test_a_zstd_chunk_that_inflates_past_its_recorded_size_is_refused_without_inflating_it(
    written: dict[str, Path], tmp_path: Path, sized: bool
) -> None:
    """A zstd chunk was decompressed whole before its size was compared with the one
    index.json records: a 64 KB file naming 600 bytes took gigabytes of memory first."""
    out = copy_with_index(written["arrays-chunk-zstd"], tmp_path / "l", lambda index: None)
    first = json.loads((out / "index.json").read_text())["chunks"][0]
    zeros = bytes(64 << 20)
    packed = zstandard.ZstdCompressor(write_content_size=sized).compress(zeros)
    (out / first["filename"]).write_bytes(packed)
    dataset = Dataset.from_path("l", out)
    tracemalloc.start()
    try:
        with pytest.raises(DataError, match=r"inflates to more than the \d+ bytes") as caught:
            dataset.read_rows(0, [0])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert caught.value.shard == str(out / first["filename"])
    assert peak < len(zeros) // 8


@pytest.mark.parametrize("variant", ["arrays-framed-zstd", "text-arrow-footer", "tokens"])
def test_eight_threads_reading_at_random_see_what_one_thread_sees(
    written: dict[str, Path], variant: str
) -> None:
    assert_threads_read_like_one(lambda: Dataset.from_path("l", written[variant]))


def test_a_pickled_dataset_travels_without_its_chunks_and_reads_the_same(
    written: dict[str, Path],
) -> None:
    dataset = Dataset.from_path("l", written["arrays-framed-zstd"], columns=["text", "tokens"])
    before = [plain(row) for row in dataset.read_rows(1, [2, 0])]
    payload = pickle.dumps(dataset)
    assert len(payload) < 4096
    assert [plain(row) for row in pickle.loads(payload).read_rows(1, [2, 0])] == before


def test_a_token_item_that_does_not_decode_is_named_by_row(
    written: dict[str, Path], tmp_path: Path
) -> None:
    for file in written["tokens"].iterdir():
        (tmp_path / file.name).write_bytes(file.read_bytes())
    dataset = Dataset.from_path("broken", tmp_path)
    victim = Path(dataset.shards[0].path)
    data = bytearray(victim.read_bytes())
    end = 4 + 4 * 4  # offsets[4]: where item 3 ends; one byte later leaves it odd-sized
    data[end : end + 4] = (int.from_bytes(data[end : end + 4], "little") + 1).to_bytes(4, "little")
    victim.write_bytes(bytes(data))
    assert len(dataset.read_rows(0, [0, 1, 2])) == 3  # the whole-chunk path reads the rest
    with pytest.raises(DataError, match=r"row 3: item does not decode") as caught:
        dataset.read_rows(0, [5, 3, 4])
    assert (caught.value.dataset, caught.value.shard) == ("broken", str(victim))
