"""Directories described by an `index.json`: MosaicML MDS and LitData, told apart by content.

MDS writes `{"version": 2, "shards": [{"format": "mds", ...}]}`; LitData writes
`{"chunks": [...], "config": {...}}`. Shard files are named relative to the index's folder,
which may be a local folder or a URL (`s3://bucket/dataset`).
"""

from __future__ import annotations

import json
import os
from typing import Any

from zephon_torch.errors import ConfigError, DataError
from zephon_torch.io._locate import Locate, local_file

INDEX_FILE = "index.json"


def index_format(index_path: str) -> str | None:
    """Returns "mds" or "litdata" for the `index.json` at `index_path`, else None.

    Raises:
        ConfigError: for an MDS index of another mosaicml-streaming format (json, csv, tsv).
    """
    try:
        with open(index_path, "rb") as handle:
            index = json.load(handle)
    except (OSError, ValueError):
        return None
    return index_kind(index, index_path)


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
                index = json.load(handle)
        except (OSError, ValueError) as error:
            raise DataError(
                f"cannot read the index: {error}", dataset=dataset, shard=index_path
            ) from None
    if not isinstance(index, dict):
        raise DataError("the index is not a JSON object", dataset=dataset, shard=index_path)
    return index


def shard_path(index_path: str, name: str, *, dataset: str) -> str:
    """Returns the path of a shard an index lists: absolute, or a URL next to a remote index.

    A local shard file must exist; a remote one is checked against the listing by the
    remote reader (see `missing_shard`).

    Raises:
        DataError: naming the shard, when its local file is missing.
    """
    if "://" in index_path:
        folder = index_path.rpartition("/")[0]
        return f"{folder}/{os.path.normpath(name)}"
    path = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(index_path)), name))
    if not os.path.isfile(path):
        raise missing_shard(path, dataset=dataset)
    return path


def missing_shard(path: str, *, dataset: str) -> DataError:
    """The error for a shard file that the index lists but storage does not hold."""
    return DataError(
        f"the shard file is missing, though {INDEX_FILE} lists it", dataset=dataset, shard=path
    )
