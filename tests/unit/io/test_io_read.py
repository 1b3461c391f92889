"""Reading rows: round trips per format, errors naming the row, threads and pickling."""

from __future__ import annotations

import gc
import pickle
import random
import sys
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from zephon_torch.errors import DataError
from zephon_torch.io import Dataset

Rows = list[dict[str, Any]]


@pytest.fixture(params=["jsonl", "jsonl.gz", "jsonl.zst", "parquet", "memory"])
def three_shards(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    write_jsonl: Any,
    write_parquet: Any,
    rows_factory: Callable[..., Rows],
) -> tuple[Dataset, list[Rows]]:
    """A dataset of three shards (50, 50 and 7 rows) in each format, with the rows written."""
    tables = [rows_factory(50), rows_factory(50, start=50), rows_factory(7, start=100)]
    kind = request.param
    if kind == "memory":
        flat = [row for table in tables for row in table]
        return Dataset.from_dict("d", flat, shard_size=50), tables
    for number, table in enumerate(tables):
        path = tmp_path / "data" / f"{number}.{kind}"
        if kind == "parquet":
            write_parquet(path, table, row_group_size=16)
        else:
            compression = {"jsonl": None, "jsonl.gz": "gzip", "jsonl.zst": "zstd"}[kind]
            write_jsonl(path, table, compression=compression)
    return Dataset.from_path("d", tmp_path / "data"), tables


def test_every_row_reads_back_as_written(three_shards: tuple[Dataset, list[Rows]]) -> None:
    dataset, tables = three_shards
    assert [shard.num_rows for shard in dataset.shards] == [len(table) for table in tables]
    for number, table in enumerate(tables):
        assert dataset.read_rows(number, range(len(table))) == table


def test_rows_come_in_the_order_asked_with_repeats(
    three_shards: tuple[Dataset, list[Rows]],
) -> None:
    dataset, tables = three_shards
    order = [5, 0, 5, 49, 3, 3]
    assert dataset.read_rows(0, order) == [tables[0][i] for i in order]
    assert dataset.read_rows(1, np.array([7, 2], dtype=np.int32)) == [tables[1][7], tables[1][2]]
    assert dataset.read_rows(2, []) == []


def test_each_read_returns_new_dicts(three_shards: tuple[Dataset, list[Rows]]) -> None:
    dataset, tables = three_shards
    first = dataset.read_rows(0, [1])
    first[0]["id"] = -1
    assert dataset.read_rows(0, [1]) == [tables[0][1]]


def test_an_out_of_range_row_names_the_row_and_the_shard_size(
    three_shards: tuple[Dataset, list[Rows]],
) -> None:
    dataset, _ = three_shards
    for bad in (7, -1):
        with pytest.raises(DataError, match=rf"row {bad} is out of range: the shard has 7 rows"):
            dataset.read_rows(2, [0, bad])
    with pytest.raises(DataError) as caught:
        dataset.read_rows(2, [100])
    assert (caught.value.dataset, caught.value.shard, caught.value.row) == (
        "d",
        dataset.shards[2].path,
        100,
    )


def test_an_out_of_range_shard_is_a_data_error(three_shards: tuple[Dataset, list[Rows]]) -> None:
    dataset, _ = three_shards
    with pytest.raises(DataError, match="shard 3 is out of range: the dataset has 3 shards"):
        dataset.read_rows(3, [0])


def test_rows_must_be_integers(three_shards: tuple[Dataset, list[Rows]]) -> None:
    dataset, _ = three_shards
    with pytest.raises(TypeError, match="`rows` must be a flat sequence of ints"):
        dataset.read_rows(0, [1.5])  # type: ignore[list-item]


def test_sixteen_threads_read_what_one_thread_reads(
    three_shards: tuple[Dataset, list[Rows]],
) -> None:
    dataset, tables = three_shards
    rng = random.Random(7)
    requests = []
    for _ in range(400):
        shard = rng.randrange(len(tables))
        requests.append((shard, [rng.randrange(len(tables[shard])) for _ in range(64)]))
    expected = [[tables[shard][row] for row in rows] for shard, rows in requests]
    fresh = pickle.loads(pickle.dumps(dataset))  # empty caches: threads race to fill them
    results: list[Rows | None] = [None] * len(requests)
    errors: list[BaseException] = []
    barrier = threading.Barrier(16)

    def work(worker: int) -> None:
        try:
            barrier.wait()
            for number in range(worker, len(requests), 16):
                shard, rows = requests[number]
                results[number] = fresh.read_rows(shard, rows)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=work, args=(worker,)) for worker in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert results == expected


def test_a_pickled_dataset_still_reads(three_shards: tuple[Dataset, list[Rows]]) -> None:
    dataset, tables = three_shards
    dataset.read_rows(1, [3])  # fill caches and open files before pickling
    copy = pickle.loads(pickle.dumps(dataset))
    assert repr(copy) == repr(dataset)
    assert copy.shards == dataset.shards
    assert copy.fingerprint() == dataset.fingerprint()
    assert copy.read_rows(1, [3, 49]) == [tables[1][3], tables[1][49]]


def test_a_dataset_dropped_after_reading_leaves_no_unclosed_file_warning(
    tmp_path: Path, write_jsonl: Any, rows_factory: Callable[..., Rows]
) -> None:
    """Plain JSONL shards were kept open as file objects, which warned (ResourceWarning, an
    error in a suite that turns warnings into errors) when the dataset was dropped."""
    rows = rows_factory(5)
    write_jsonl(tmp_path / "a.jsonl", rows)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dataset = Dataset.from_path("d", tmp_path / "a.jsonl")
        assert dataset.read_rows(0, [4]) == [rows[4]]
        del dataset
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]


def test_a_pickled_file_dataset_carries_no_rows(
    tmp_path: Path, write_jsonl: Any, rows_factory: Callable[..., Rows]
) -> None:
    path = write_jsonl(tmp_path / "a.jsonl.gz", rows_factory(2000), compression="gzip")
    dataset = Dataset.from_path("d", path)
    dataset.read_rows(0, [1999])
    assert len(pickle.dumps(dataset)) < 2000


def test_a_malformed_line_names_dataset_shard_and_row(tmp_path: Path, write_jsonl: Any) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", text='{"a": 1}\n\n{"a": 2}\n{"a": \n{"a": 4}\n')
    dataset = Dataset.from_path("wiki", path)
    assert dataset.read_rows(0, [0, 1, 3]) == [{"a": 1}, {"a": 2}, {"a": 4}]
    with pytest.raises(DataError, match="malformed JSON") as caught:
        dataset.read_rows(0, [1, 2])
    error = caught.value
    assert (error.dataset, error.shard, error.row) == ("wiki", str(path), 2)
    assert "Expecting value" in str(error)
    assert f"dataset 'wiki', shard {str(path)!r}, row 2" in str(error)


def test_a_malformed_line_in_a_compressed_file_is_reported_too(
    tmp_path: Path, write_jsonl: Any
) -> None:
    path = write_jsonl(tmp_path / "a.jsonl.zst", text='{"a": 1}\n{oops}\n', compression="zstd")
    with pytest.raises(DataError, match=r"row 1: malformed JSON .*Expecting property name"):
        Dataset.from_path("d", path).read_rows(0, [1])


def test_a_line_nested_too_deep_to_parse_names_its_row(tmp_path: Path, write_jsonl: Any) -> None:
    """A line nested past the parser's recursion limit raised a bare RecursionError."""
    deep = '{"meta": ' + "[" * 100_000 + "]" * 100_000 + "}"
    path = write_jsonl(tmp_path / "a.jsonl", text=f'{{"a": 1}}\n{deep}\n')
    with pytest.raises(DataError, match=r"row 1: malformed JSON .*recursion") as caught:
        Dataset.from_path("d", path).read_rows(0, [0, 1])
    assert (caught.value.dataset, caught.value.shard) == ("d", str(path))


def test_invalid_utf8_is_malformed_json(tmp_path: Path, write_jsonl: Any) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", text=b'{"a": "\xff"}\n')
    with pytest.raises(DataError, match=r"malformed JSON.*utf-8"):
        Dataset.from_path("d", path).read_rows(0, [0])


@pytest.mark.parametrize(
    ("line", "kind"), [("[1, 2]", "array"), ('"text"', "string"), ("3", "number")]
)
def test_a_line_that_is_not_an_object_is_a_data_error(
    tmp_path: Path, write_jsonl: Any, line: str, kind: str
) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", text=f'{{"a": 1}}\n{line}\n')
    with pytest.raises(
        DataError, match=f"expected a JSON object per line, got a JSON {kind}"
    ) as caught:
        Dataset.from_path("d", path).read_rows(0, [1])
    assert caught.value.row == 1


def test_a_file_of_one_json_array_of_objects_is_told_to_be_no_json_lines(
    tmp_path: Path, write_jsonl: Any
) -> None:
    """A one-line JSON array export got only "expected a JSON object per line" (a
    fresh-user trial); a line of a plain array keeps that message alone."""
    path = write_jsonl(tmp_path / "a.json", text='[{"text": "a"}, {"text": "b"}]\n')
    with pytest.raises(DataError, match=r"looks like one JSON array of objects, not JSON Lines"):
        Dataset.from_path("d", path).read_rows(0, [0])
    path = write_jsonl(tmp_path / "b.jsonl", text="[1, 2]\n")
    with pytest.raises(DataError, match=r"got a JSON array in the line at byte 0$"):
        Dataset.from_path("d", path).read_rows(0, [0])


def test_lines_with_whitespace_crlf_and_a_bom_parse_like_json_loads(
    tmp_path: Path, write_jsonl: Any
) -> None:
    text = '\ufeff{"a": 1}\r\n  {"a": 2}\t\r\n\r\n{"a": "\\u00e9"}'
    dataset = Dataset.from_path("d", write_jsonl(tmp_path / "a.jsonl", text=text))
    assert dataset.read_rows(0, [0, 1, 2]) == [{"a": 1}, {"a": 2}, {"a": "é"}]


def test_a_corrupt_compressed_file_is_a_data_error(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl.gz"
    path.write_bytes(b"\x1f\x8b" + b"\x00" * 20)
    with pytest.raises(DataError, match="cannot decompress this gzip file") as caught:
        Dataset.from_path("d", path)
    assert caught.value.shard == str(path)


def test_zstd_without_zstandard_raises_the_install_hint(
    tmp_path: Path, write_jsonl: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_jsonl(tmp_path / "a.jsonl.zst", [{"a": 1}], compression="zstd")
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with pytest.raises(ImportError, match=r"pip install 'zephon-torch\[zstd\]'"):
        Dataset.from_path("d", path)


def test_parquet_nested_and_null_values_read_as_python(tmp_path: Path, write_parquet: Any) -> None:
    rows = [{"a": [1, 2], "b": {"c": None}, "d": None}, {"a": [], "b": {"c": "x"}, "d": 1.5}]
    dataset = Dataset.from_path("d", write_parquet(tmp_path / "a.parquet", rows))
    assert dataset.read_rows(0, [1, 0]) == [rows[1], rows[0]]


def test_parquet_reads_across_many_row_groups_with_a_small_cache(
    tmp_path: Path, write_parquet: Any
) -> None:
    rows = [{"i": i} for i in range(100)]
    dataset = Dataset.from_path("d", write_parquet(tmp_path / "a.parquet", rows, row_group_size=3))
    order = list(range(99, -1, -7)) * 3
    assert dataset.read_rows(0, order) == [rows[i] for i in order]


def test_a_file_that_shrank_after_opening_is_reported_not_misread(
    tmp_path: Path, write_jsonl: Any
) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [{"a": i} for i in range(10)])
    dataset = Dataset.from_path("d", path)
    copy = pickle.loads(pickle.dumps(dataset))  # a worker that opens the file later
    write_jsonl(path, [{"a": i} for i in range(3)])
    with pytest.raises(DataError, match="did the file change"):
        copy.read_rows(0, [5])


@pytest.mark.parametrize("name", ["a.jsonl", "a.jsonl.gz"])
def test_a_jsonl_shard_removed_after_opening_is_a_data_error_naming_it(
    tmp_path: Path, write_jsonl: Any, name: str
) -> None:
    compression = "gzip" if name.endswith(".gz") else None
    path = write_jsonl(tmp_path / name, [{"a": i} for i in range(10)], compression=compression)
    dataset = Dataset.from_path("d", path)
    copy = pickle.loads(pickle.dumps(dataset))  # a worker that opens the file later
    path.unlink()
    with pytest.raises(DataError, match="the shard file is missing") as caught:
        copy.read_rows(0, [5])
    assert (caught.value.dataset, caught.value.shard) == ("d", str(path))
