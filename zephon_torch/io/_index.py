"""Directories described by an `index.json`: MosaicML MDS and LitData, told apart by content.

MDS writes `{"version": 2, "shards": [{"format": "mds", ...}]}`; LitData writes
`{"chunks": [...], "config": {...}}`. Shard files are named relative to the index's folder,
which may be a local folder or a URL (`s3://bucket/dataset`).
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Sequence
from typing import Any

from zephon_torch.errors import ConfigError, DataError
from zephon_torch.io._locate import Locate, local_file
from zephon_torch.io._rows import machine_fault

INDEX_FILE = "index.json"


def index_format(index_path: str) -> str | None:
    """Returns "mds" or "litdata" for the `index.json` at `index_path`, else None.

    Raises:
        ConfigError: for an MDS index of another mosaicml-streaming format (json, csv, tsv).
    """
    try:
        with open(index_path, "rb") as handle:
            index = parse_json(handle.read())
    except (OSError, ValueError):
        return None
    return index_kind(index, index_path)


def parse_json(data: bytes) -> object:
    """`json.loads`, where JSON nested too deeply to parse is a ValueError like any other
    that is not JSON, not a RecursionError."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("its JSON nests too deeply to parse") from None


def index_kind(index: object, index_path: str) -> str | None:
    """Returns "mds" or "litdata" for a parsed `index.json`, else None (see `index_format`)."""
    if not isinstance(index, dict):
        return None
    if isinstance(index.get("chunks"), list) and isinstance(index.get("config"), dict):
        return "litdata"
    shards = index.get("shards")
    if isinstance(shards, list) and all(isinstance(s, dict) for s in shards):
        formats = sorted({str(shard.get("format")) for shard in shards})
        if formats in (["mds"], []):  # none: MDSWriter's index of no samples
            return "mds"
        raise ConfigError(
            f"{index_path!r} indexes mosaicml-streaming shards of format {', '.join(formats)}; "
            "only 'mds' shards are read"
        )
    return None


def load_index(index_path: str, *, dataset: str, locate: Locate = local_file) -> dict[str, Any]:
    """Reads an `index.json` (a path or, with a remote `locate`, a URL) as a dict.

    Raises:
        DataError: naming the index, when it cannot be read or is not a JSON object.
    """
    with locate(index_path) as local:
        try:
            with open(local, "rb") as handle:
                index = parse_json(handle.read())
        except (OSError, ValueError) as error:
            if machine_fault(error):
                raise
            raise DataError(
                f"cannot read the index: {error}", dataset=dataset, shard=index_path
            ) from None
    if not isinstance(index, dict):
        raise DataError("the index is not a JSON object", dataset=dataset, shard=index_path)
    return index


def shard_path(index_path: str, name: str, *, dataset: str, must_exist: bool = True) -> str:
    """Returns the path of a shard an index lists: absolute, or a URL next to a remote index.

    The name must stay inside the index's folder once normalised (subfolders are fine; `..`
    past the folder and absolute names are refused), so an index reads no other files; the
    name is checked, not where a symlink leads, so shards linked in from elsewhere read. A
    local shard file must exist; a remote one is checked against the listing by the remote
    reader (see `missing_shard`); `must_exist=False` leaves the local file unchecked.

    Raises:
        DataError: naming the shard, when its name leads outside the folder or its local
            file is missing.
    """
    relative = posixpath.normpath(name)
    remote = "://" in index_path
    folder = (
        index_path.rpartition("/")[0] if remote else os.path.dirname(os.path.abspath(index_path))
    )
    path = f"{folder}/{relative}" if remote else os.path.normpath(os.path.join(folder, name))
    if posixpath.isabs(relative) or os.path.isabs(name) or relative.split("/")[0] == "..":
        raise DataError(
            f"{INDEX_FILE} names the shard {name!r}, which lies outside the dataset folder "
            f"{folder!r}; shard names must be relative paths inside it",
            dataset=dataset,
            shard=path,
        )
    if must_exist and not remote and not os.path.isfile(path):
        raise missing_shard(path, dataset=dataset)
    return path


def check_listed_once(paths: Sequence[str], *, dataset: str) -> None:
    """Refuses an index that lists one shard file twice: its rows would be read once while
    the index counts them twice, or twice as if they were two shards.

    Raises:
        DataError: naming the first shard listed twice and both its places in the index.
    """
    first: dict[str, int] = {}
    for number, path in enumerate(paths):
        if path in first:
            raise DataError(
                f"{INDEX_FILE} lists this shard file twice (as shards {first[path]} and "
                f"{number}); each file must be listed once",
                dataset=dataset,
                shard=path,
            )
        first[path] = number


def missing_shard(path: str, *, dataset: str) -> DataError:
    """The error for a shard file that the index lists but storage does not hold."""
    return DataError(
        f"the shard file is missing, though {INDEX_FILE} lists it", dataset=dataset, shard=path
    )


# the most items an MDS shard or LitData chunk can hold: both write the count in 4 bytes
MAX_ITEMS = 2**32 - 1


def recorded_count(
    value: object, what: str, *, dataset: str, shard: str, most: int | None = None
) -> int:
    """A count `index.json` records for a shard (its samples, its bytes): a whole number >= 0,
    and at most `most` where given.

    Raises:
        DataError: naming the shard, for a negative number or a value of another type (a
            float, a string, a bool, null), which would be truncated or fail later; or one
            above `most` (a count past int64 was a bare OverflowError once a job laid out
            its rows, and counts summed over shards must stay inside int64).
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DataError(
            f"{INDEX_FILE} records {value!r} {what} for this shard, where a count (a whole "
            "number >= 0) is expected",
            dataset=dataset,
            shard=shard,
        )
    if most is not None and value > most:
        raise DataError(
            f"{INDEX_FILE} records {value} {what} for this shard, more than the {most} its "
            "file can hold (its header's count is 4 bytes)",
            dataset=dataset,
            shard=shard,
        )
    return value
