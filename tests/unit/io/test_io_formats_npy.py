"""Pre-tokenized `.npy` files: 2-D [rows, tokens], or 1-D tokens plus `.offsets.npy`."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from tests.unit.io.test_io_formats_writers import assert_threads_read_like_one
from zephon_torch.errors import DataError
from zephon_torch.io import Dataset


@pytest.fixture
def npy_dir(tmp_path: Path) -> Path:
    np.save(tmp_path / "a.npy", np.arange(40, dtype=np.int32).reshape(8, 5))
    np.save(tmp_path / "b.npy", np.arange(100, 110, dtype=np.uint16))
    np.save(tmp_path / "b.offsets.npy", np.array([0, 3, 3, 10], dtype=np.int64))
    return tmp_path


def test_each_row_is_one_document_of_token_ids(npy_dir: Path) -> None:
    dataset = Dataset.from_path("n", npy_dir)
    assert dataset.format == "npy"
    assert [Path(s.path).name for s in dataset.shards] == ["a.npy", "b.npy"]
    assert [s.num_rows for s in dataset.shards] == [8, 3]
    [row] = dataset.read_rows(0, [2])
    assert list(row) == ["input_ids"] and row["input_ids"].tolist() == [10, 11, 12, 13, 14]
    assert type(row["input_ids"]) is np.ndarray and not row["input_ids"].flags.writeable
    rows = dataset.read_rows(1, [2, 1, 0])
    assert [r["input_ids"].tolist() for r in rows] == [list(range(103, 110)), [], [100, 101, 102]]
    assert rows[0]["input_ids"].dtype == np.uint16


def test_a_flat_token_file_without_offsets_is_refused(tmp_path: Path) -> None:
    np.save(tmp_path / "flat.npy", np.arange(10))
    with pytest.raises(
        DataError, match=r"or 1-D with its document boundaries in 'flat.offsets.npy'"
    ):
        Dataset.from_path("n", tmp_path)


@pytest.mark.parametrize("change", ["appended to", "cut short"])
def test_a_token_file_not_the_size_its_header_says_is_a_data_error(
    tmp_path: Path, change: str
) -> None:
    """Ids appended after `np.save` were never read, without a word; a cut file said only
    "mmap length is greater than file size"."""
    path = tmp_path / "t.npy"
    np.save(path, np.arange(20, dtype=np.int32).reshape(4, 5))
    stated = path.stat().st_size
    if change == "appended to":
        with path.open("ab") as out:
            out.write(np.arange(5, dtype=np.int32).tobytes())
        how = "20 bytes longer than that"
    else:
        with path.open("r+b") as out:
            out.truncate(stated - 8)
        how = "cut short"
    said = rf"shape \(4, 5\) and dtype int32, {stated} bytes with the header, but the file has "
    with pytest.raises(DataError, match=said + rf"{path.stat().st_size}: {how}") as caught:
        Dataset.from_path("n", tmp_path)
    assert caught.value.shard == str(path)


@pytest.mark.parametrize(
    ("offsets", "tokens"),
    [([0, 4, 3, 10], np.arange(10)), ([0, 5, 9], np.arange(10)), ([0, 10], np.ones(10))],
    ids=["falling", "short", "floats"],
)
def test_bad_offsets_or_non_integer_tokens_raise_a_data_error_naming_the_shard(
    tmp_path: Path, offsets: list[int], tokens: np.ndarray
) -> None:
    np.save(tmp_path / "t.npy", tokens)
    np.save(tmp_path / "t.offsets.npy", np.array(offsets))
    with pytest.raises(DataError, match=r"offsets .* must rise|not integer token ids") as caught:
        Dataset.from_path("bad", tmp_path)
    assert caught.value.shard == str(tmp_path / "t.npy")
    # wrong from the first open: not blamed on a change since (review H, F7)
    assert "did the file change" not in str(caught.value)


def test_offsets_of_floats_are_named_as_offsets(tmp_path: Path) -> None:
    np.save(tmp_path / "t.npy", np.arange(10, dtype=np.int32))
    np.save(tmp_path / "t.offsets.npy", np.array([0.0, 10.0]))
    with pytest.raises(DataError, match=r"holds float64 values, not integer offsets") as caught:
        Dataset.from_path("bad", tmp_path)
    assert caught.value.shard == str(tmp_path / "t.offsets.npy")


@pytest.mark.parametrize("empty", ["t.npy", "t.offsets.npy"])
def test_an_empty_token_or_offsets_file_is_a_data_error_naming_it(
    tmp_path: Path, empty: str
) -> None:
    np.save(tmp_path / "t.npy", np.arange(10, dtype=np.int32))
    np.save(tmp_path / "t.offsets.npy", np.array([0, 4, 10]))
    (tmp_path / empty).write_bytes(b"")
    with pytest.raises(DataError, match=r"not a readable \.npy file") as caught:
        Dataset.from_path("n", tmp_path)
    assert caught.value.shard == str(tmp_path / empty)


def test_an_offsets_file_without_its_token_file_is_named_as_such(tmp_path: Path) -> None:
    """It was read as a token file of its own, and the error named 'b.offsets.offsets.npy'."""
    np.save(tmp_path / "a.npy", np.arange(10, dtype=np.int32))
    np.save(tmp_path / "a.offsets.npy", np.array([0, 4, 10]))
    np.save(tmp_path / "b.offsets.npy", np.array([0, 4, 10]))
    with pytest.raises(DataError, match=r"an offsets file without its token file 'b.npy'") as e:
        Dataset.from_path("n", tmp_path)
    assert e.value.shard == str(tmp_path / "b.offsets.npy")
    # a token file of that name, with offsets of its own, reads
    np.save(tmp_path / "b.offsets.offsets.npy", np.array([0, 1, 3]))
    assert Dataset.from_path("n", tmp_path / "b.offsets.npy").read_rows(0, [1])[0][
        "input_ids"
    ].tolist() == [4, 10]


def test_a_token_file_of_no_documents_is_left_out_with_a_warning(tmp_path: Path) -> None:
    """Offsets [0] over no token: a complete file of no rows (a tokenizing worker that got no
    document writes one), left out with a warning as an empty Parquet partition is; it failed
    the whole dataset as "an empty file" (a fresh-user trial). Alone, it has no rows."""
    np.save(tmp_path / "a.npy", np.arange(10, dtype=np.int32))
    np.save(tmp_path / "a.offsets.npy", np.array([0, 4, 10]))
    np.save(tmp_path / "b.npy", np.zeros(0, dtype=np.int32))
    np.save(tmp_path / "b.offsets.npy", np.array([0]))
    np.save(tmp_path / "c.npy", np.zeros((0, 5), dtype=np.int32))
    with pytest.warns(UserWarning, match=r"2 of its 3 npy files hold no rows and are left out"):
        dataset = Dataset.from_path("n", tmp_path)
    assert [shard.path for shard in dataset.shards] == [str(tmp_path / "a.npy")]
    assert dataset.read_rows(0, [1])[0]["input_ids"].tolist() == list(range(4, 10))
    with pytest.raises(DataError, match=r"has no rows; remove it") as caught:
        Dataset.from_path("n", tmp_path / "b.npy")
    assert caught.value.shard == str(tmp_path / "b.npy")
    assert "empty file" not in str(caught.value)


def test_threads_and_pickling_read_the_same_rows(npy_dir: Path) -> None:
    assert_threads_read_like_one(lambda: Dataset.from_path("n", npy_dir), asks=50)
    dataset = Dataset.from_path("n", npy_dir)
    copy = pickle.loads(pickle.dumps(dataset))
    assert copy.read_rows(1, [2])[0]["input_ids"].tolist() == list(range(103, 110))


def test_a_token_file_removed_after_opening_is_a_data_error_naming_it(npy_dir: Path) -> None:
    dataset = pickle.loads(pickle.dumps(Dataset.from_path("n", npy_dir)))  # nothing mapped yet
    (npy_dir / "b.npy").unlink()
    with pytest.raises(DataError, match=r"dataset 'n'.*b\.npy.*token file is missing"):
        dataset.read_rows(1, [0])
