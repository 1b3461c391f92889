"""MDS shard hashes (MDSWriter's `hashes=[...]`) checked with `io_options={"mds":
{"verify_hashes": True}}`: local and remote shards, plain and zstd."""

from __future__ import annotations

import json
import pickle
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import pytest

from tests.unit.io.test_io_formats_writers import plain, sample_rows, write_mds
from zephon_torch.errors import ConfigError, DataError
from zephon_torch.io import Dataset, _hashes

COLUMNS = {"text": "str", "id": "int", "tokens": "ndarray:int32"}
ROWS = sample_rows(80)
VERIFY = {"mds": {"verify_hashes": True}}


def _every_row(dataset: Dataset) -> list[dict[str, Any]]:
    return [
        plain(row)
        for number, shard in enumerate(dataset.shards)
        for row in dataset.read_rows(number, range(shard.num_rows))
    ]


def _flip_byte(path: Path, at: int) -> None:
    """One byte of the file changed in place (`at` from the end when negative): same length,
    same sample offsets."""
    data = bytearray(path.read_bytes())
    data[at] ^= 0x40
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_a_flipped_byte_is_a_data_error_naming_the_shard_and_the_hash(
    tmp_path: Path, compression: str | None
) -> None:
    out = write_mds(
        tmp_path / "h",
        ROWS,
        COLUMNS,
        compression=compression,
        size_limit=1500,
        hashes=["md5", "sha1", "xxh64"],
    )
    checked = Dataset.from_path("m", out, io_options=VERIFY)
    assert _every_row(checked) == [plain(row) for row in ROWS]  # intact shards pass
    victim = Path(checked.shards[1].path)
    _flip_byte(victim, -1)  # plain: the high byte of the shard's last token id
    fresh = Dataset.from_path("m", out, io_options=VERIFY)
    with pytest.raises(DataError, match=r"shard's xxh64 is [0-9a-f]+ where the index") as caught:
        fresh.read_rows(1, [0])
    assert (caught.value.dataset, caught.value.shard) == ("m", str(victim))
    assert len(fresh.read_rows(0, [0])) == 1  # the other shards still read
    if compression is None:  # without the check, the wrong id reads back unnoticed
        unchecked = Dataset.from_path("m", out)
        last = unchecked.shards[1].num_rows - 1
        first = unchecked.shards[0].num_rows
        wrong = unchecked.read_rows(1, [last])[0]["tokens"]
        assert wrong[-1] != ROWS[first + last]["tokens"][-1]


def test_each_shard_is_hashed_once_per_process_and_again_in_a_pickled_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = write_mds(tmp_path / "h", ROWS, COLUMNS, size_limit=1500, hashes=["sha1"])
    hashed: list[int] = []
    real_pick = _hashes.pick_hash

    def counting_pick(recorded: Any) -> tuple[str, Callable[[Any], Any]] | None:
        picked = real_pick(recorded)
        assert picked is not None
        name, function = picked

        def counted(data: Any) -> Any:
            hashed.append(len(data))
            return function(data)

        return name, counted

    monkeypatch.setattr(_hashes, "pick_hash", counting_pick)
    dataset = Dataset.from_path("m", out, io_options=VERIFY)
    sizes = [Path(shard.path).stat().st_size for shard in dataset.shards]
    for _ in range(3):
        _every_row(dataset)
    assert hashed == sizes  # every shard, whole, once, in the order first read
    copy = pickle.loads(pickle.dumps(dataset))
    _every_row(copy)
    assert hashed == sizes + sizes  # a copy (as in a DataLoader worker) checks for itself


def test_an_index_without_a_usable_hash_is_refused_at_open(tmp_path: Path) -> None:
    out = write_mds(tmp_path / "none", ROWS[:20], COLUMNS, size_limit=1500)
    assert Dataset.from_path("m", out).num_rows == 20  # opens without the check
    with pytest.raises(DataError, match=r"records no hash .* \(recorded: none;") as caught:
        Dataset.from_path("m", out, io_options=VERIFY)
    assert caught.value.dataset == "m" and caught.value.shard == str(out / "shard.00000.mds")
    index = json.loads((out / "index.json").read_text())
    for shard in index["shards"]:
        shard["raw_data"]["hashes"] = {"shake_128": "00", "crc99": "11"}
    (out / "index.json").write_text(json.dumps(index))
    with pytest.raises(DataError, match=r"\(recorded: crc99, shake_128;"):
        Dataset.from_path("m", out, io_options=VERIFY)


def test_xxhash_hashes_without_the_package_name_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = write_mds(tmp_path / "x", ROWS[:20], COLUMNS, hashes=["xxh64"])
    assert Dataset.from_path("m", out, io_options=VERIFY).read_rows(0, [0])
    monkeypatch.setitem(sys.modules, "xxhash", None)  # as if not installed: import fails
    with pytest.raises(DataError, match=r"recorded: xxh64; xxh\* ones need `pip install xxhash`"):
        Dataset.from_path("m", out, io_options=VERIFY)


def test_the_option_is_validated_and_can_be_turned_on_for_an_open_dataset(
    tmp_path: Path,
) -> None:
    out = write_mds(tmp_path / "h", ROWS, COLUMNS, size_limit=1500, hashes=["md5"])
    with pytest.raises(ConfigError, match=r"mds `verify_hashes` must be True or False"):
        Dataset.from_path("m", out, io_options={"mds": {"verify_hashes": "yes"}})
    with pytest.raises(ConfigError, match=r"known keys are verify_hashes"):
        Dataset.from_path("m", out, io_options={"mds": {"verify": True}})
    dataset = Dataset.from_path("m", out)
    _flip_byte(Path(dataset.shards[0].path), -1)
    dataset.read_rows(0, [0])  # unchecked: no error
    checked = dataset.with_io_options(VERIFY)
    with pytest.raises(DataError, match=r"shard's md5 is"):
        checked.read_rows(0, [0])
    assert dataset.with_io_options({"mds": {"verify_hashes": False}}).read_rows(0, [0])


def test_a_remote_shard_is_checked_as_downloaded(tmp_path: Path) -> None:
    out = write_mds(tmp_path / "h", ROWS, COLUMNS, size_limit=1500, hashes=["sha1"])
    _flip_byte(out / "shard.00002.mds", -1)
    root = f"/zt-{uuid.uuid4().hex[:8]}"
    fsspec.filesystem("memory").put(str(out), root, recursive=True)
    options = {"cache": {"dir": str(tmp_path / "cache")}, **VERIFY}
    dataset = Dataset.from_path("m", f"memory://{root}", io_options=options)
    assert len(dataset.read_rows(1, [0])) == 1
    with pytest.raises(DataError, match=r"shard's sha1 is") as caught:
        dataset.read_rows(2, [0])
    assert caught.value.shard == f"memory://{root}/shard.00002.mds"


def test_an_mds_section_not_naming_verify_hashes_keeps_it_on_a_local_dataset(
    tmp_path: Path,
) -> None:
    out = write_mds(tmp_path / "h", ROWS, COLUMNS, size_limit=1500, hashes=["sha1"])
    _flip_byte(out / "shard.00000.mds", -1)
    checked = Dataset.from_path("m", out, io_options=VERIFY)
    for kept in ({"mds": {}}, {"mds": None}):  # as for a remote dataset: the rest are kept
        with pytest.raises(DataError, match=r"shard's sha1 is"):
            checked.with_io_options(kept).read_rows(0, [0])
    assert checked.with_io_options({"mds": {"verify_hashes": False}}).read_rows(0, [0])


def test_hashes_recorded_in_another_shape_do_not_stop_an_unchecked_open(tmp_path: Path) -> None:
    out = write_mds(tmp_path / "odd", ROWS[:20], COLUMNS, size_limit=1500)
    index = json.loads((out / "index.json").read_text())
    for shard in index["shards"]:
        shard["raw_data"]["hashes"] = ["sha1"]  # names, not {name: digest}
    (out / "index.json").write_text(json.dumps(index))
    assert Dataset.from_path("m", out).num_rows == 20  # read as before the hashes were
    with pytest.raises(DataError, match=r"records no hash .* \(recorded: none;"):
        Dataset.from_path("m", out, io_options=VERIFY)


def test_a_bad_cached_copy_of_a_good_remote_shard_is_downloaded_again(tmp_path: Path) -> None:
    out = write_mds(tmp_path / "h", ROWS, COLUMNS, size_limit=1500, hashes=["sha1"])
    root = f"/zt-{uuid.uuid4().hex[:8]}"
    fsspec.filesystem("memory").put(str(out), root, recursive=True)
    options = {"cache": {"dir": str(tmp_path / "cache")}, **VERIFY}
    url = f"memory://{root}"
    first = Dataset.from_path("m", url, io_options=options)
    expected = [plain(row) for row in first.read_rows(0, range(first.shards[0].num_rows))]
    (cached,) = (tmp_path / "cache").glob("*shard.00000.mds")
    _flip_byte(cached, -1)  # the node's copy rots; the object in the store is intact
    for _ in range(2):  # each later open (a restarted job) reads the right rows
        again = Dataset.from_path("m", url, io_options=options)
        assert [plain(row) for row in again.read_rows(0, range(len(expected)))] == expected
    assert cached.read_bytes() == (out / "shard.00000.mds").read_bytes()  # replaced
    counters = again.cache_counters()
    assert counters is not None and counters["misses"] == 0  # the second open downloaded nothing
