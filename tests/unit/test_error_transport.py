"""Errors travel intact: pickled between processes, and rebuilt from a worker's traceback
text where torch re-raises them, with their fields and causes."""

from __future__ import annotations

import pickle
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._utils import ExceptionWrapper

from zephon_torch import ConfigError, DataError, StateMismatchError, StorageError
from zephon_torch.errors import WorkerTraceback
from zephon_torch.io._hashes import HashMismatch


class NeedsTwoArguments(Exception):
    """Pickles, but cannot be rebuilt from its args (a common mistake in user exceptions)."""

    def __init__(self, what: str, where: int) -> None:
        super().__init__(f"{what} at {where}")


def _raised_from(cause: BaseException, error: Exception) -> Exception:
    try:
        try:
            raise cause
        except BaseException as inner:
            raise error from inner
    except Exception as outer:
        return outer


@pytest.mark.parametrize(
    "error",
    [
        DataError("bad", dataset="d", shard="s", row=3),
        DataError("read back"),
        StorageError("gone", url="s3://b/k"),
        ConfigError("no"),
        StateMismatchError({"seed": (1, 2)}),
    ],
    ids=["data", "data-bare", "storage", "config", "mismatch"],
)
def test_pickling_keeps_the_cause_and_its_frames(error: Exception) -> None:
    sent = _raised_from(KeyError("missing"), error)
    back = pickle.loads(pickle.dumps(sent))
    assert type(back) is type(error) and str(back) == str(error)
    assert isinstance(back.__cause__, KeyError) and back.__cause__.args == ("missing",)
    frames = back.__cause__.__cause__
    assert isinstance(frames, WorkerTraceback)
    assert "in _raised_from\n    raise cause" in str(frames)
    assert str(frames).endswith("KeyError: 'missing'")


@pytest.mark.parametrize(
    "cause",
    [NeedsTwoArguments("late", 3), ValueError(lambda: None)],
    ids=["does-not-unpickle", "does-not-pickle"],
)
def test_a_cause_that_cannot_travel_comes_back_as_its_traceback_text(
    cause: BaseException,
) -> None:
    sent = _raised_from(cause, DataError("bad", dataset="d", row=1))
    back = pickle.loads(pickle.dumps(sent))
    assert isinstance(back, DataError) and (back.dataset, back.row) == ("d", 1)
    assert isinstance(back.__cause__, WorkerTraceback)
    assert type(cause).__name__ in str(back.__cause__).splitlines()[-1]
    assert "in _raised_from" in str(back.__cause__)


def test_errors_survive_pickling() -> None:
    import pickle

    from zephon_torch import StorageError

    e = pickle.loads(pickle.dumps(DataError("bad", dataset="d", shard="s", row=3)))
    assert (e.dataset, e.shard, e.row, str(e)) == (
        "d",
        "s",
        3,
        "dataset 'd', shard 's', row 3: bad",
    )
    s = pickle.loads(pickle.dumps(StorageError("gone", url="s3://b/k")))
    assert (s.url, str(s), s.reason) == ("s3://b/k", "s3://b/k: gone", "failed")
    assert pickle.loads(pickle.dumps(StorageError("no", url="u", reason="refused"))).reason == (
        "refused"
    )
    m = pickle.loads(pickle.dumps(StateMismatchError({"seed": (1, 2)})))
    assert m.mismatches == {"seed": (1, 2)}


@pytest.mark.parametrize(
    ("dataset", "shard", "row"),
    [("web", "/data/a.jsonl", 9), ('it\'s "odd"', "s3://b/x\\y.parquet", 0), ("m", None, None)],
)
def test_a_data_error_rebuilt_from_a_worker_traceback_reads_its_fields_back(
    dataset: str, shard: str | None, row: int | None
) -> None:
    """As torch re-raises a DataLoader worker's error: `type(error)(traceback text)`."""
    original = DataError("sample does not decode", dataset=dataset, shard=shard, row=row)
    text = (
        "Caught DataError in DataLoader worker process 0.\nOriginal Traceback (most recent "
        'call last):\n  File "worker.py", line 1, in <module>\n'
        f"zephon_torch.errors.DataError: {original}\n"
    )
    rebuilt = DataError(text)
    assert (rebuilt.dataset, rebuilt.shard, rebuilt.row) == (dataset, shard, row)
    assert str(rebuilt) == text  # the message is torch's, not prefixed again
    copy = pickle.loads(pickle.dumps(rebuilt))
    assert (copy.dataset, copy.shard, copy.row, str(copy)) == (dataset, shard, row, text)
    assert DataError("no traceback: dataset 'x', row 3: y").dataset is None  # only tracebacks


@settings(max_examples=300, deadline=None)
@given(dataset=st.text(), shard=st.text(), row=st.integers(0, 2**40))
def test_any_names_read_back_from_a_worker_traceback(dataset: str, shard: str, row: int) -> None:
    """Names are read back from their reprs (quotes, backslashes, any code point) by
    `unicode_escape`, not `ast`."""
    original = DataError("bad", dataset=dataset, shard=shard, row=row)
    rebuilt = DataError(
        f"Traceback (most recent call last):\nzephon_torch.errors.DataError: {original}\n"
    )
    assert (rebuilt.dataset, rebuilt.shard, rebuilt.row) == (dataset, shard, row)


def test_a_storage_error_rebuilt_from_a_worker_traceback_reads_its_url_back() -> None:
    original = StorageError("download failed after 6 attempts: timed out", url="s3://b/x.mds")
    text = "Original Traceback (most recent call last):\n"
    text += f"zephon_torch.errors.StorageError: {original}\n"
    rebuilt = StorageError(text)
    assert (rebuilt.url, str(rebuilt)) == ("s3://b/x.mds", text)
    copy = pickle.loads(pickle.dumps(rebuilt))
    assert (copy.url, str(copy)) == ("s3://b/x.mds", text)
    assert StorageError("no traceback here").url is None


def _reraised(error: BaseException) -> BaseException:
    try:
        raise error
    except BaseException:
        wrapper = ExceptionWrapper(sys.exc_info(), where="in DataLoader worker process 0")
    try:
        wrapper.reraise()
    except BaseException as got:
        return got
    raise AssertionError


def test_a_hash_mismatch_reraised_by_torch_reads_its_fields_back() -> None:
    got = _reraised(HashMismatch("bad hash", dataset="web", shard="s3://b/shard.00000.mds"))
    assert type(got) is HashMismatch
    assert (got.dataset, got.shard) == ("web", "s3://b/shard.00000.mds")


def test_a_data_error_reraised_by_torch_reads_its_fields_back() -> None:
    got = _reraised(DataError("bad row", dataset="web", shard="s3://b/x.jsonl", row=3))
    assert (got.dataset, got.shard, got.row) == ("web", "s3://b/x.jsonl", 3)


def test_a_hash_mismatch_pickles_back_as_one() -> None:
    error = HashMismatch("bad hash", dataset="web", shard="s")
    assert type(pickle.loads(pickle.dumps(error))) is HashMismatch


def test_a_storage_error_on_a_key_with_a_space_reads_its_url_back() -> None:
    got = _reraised(StorageError("read failed", url="s3://b/my shard.jsonl"))
    assert got.url == "s3://b/my shard.jsonl"


def test_a_shard_s_fault_stays_one_through_pickling() -> None:
    """``shard_wide`` decides what ``bad_rows="skip"`` may skip: it must survive the trip."""
    error = DataError("row 9 is out of range", dataset="d", shard="s", row=9, shard_wide=True)
    back = pickle.loads(pickle.dumps(error))
    assert (back.row, back.shard_wide, str(back)) == (9, True, str(error))
    assert not pickle.loads(pickle.dumps(DataError("x", dataset="d", row=1))).shard_wide
