"""Directories described by an `index.json`: MosaicML MDS and LitData, told apart by content.

MDS writes `{"version": 2, "shards": [{"format": "mds", ...}]}`; LitData writes
`{"chunks": [...], "config": {...}}`. Shard files are named relative to the index's folder.
"""

from __future__ import annotations

import json
import os
from typing import Any

from zephon_torch.errors import ConfigError, DataError

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
    if not isinstance(index, dict):
        return None
    if isinstance(index.get("chunks"), list) and isinstance(index.get("config"), dict):
        return "litdata"
    shards = index.get("shards")
    if isinstance(shards, list) and shards and all(isinstance(s, dict) for s in shards):
        formats = sorted({str(shard.get("format")) for shard in shards})
        if formats == ["mds"]:
            return "mds"
        raise ConfigError(
            f"{index_path!r} indexes mosaicml-streaming shards of format {', '.join(formats)}; "
            "only 'mds' shards are read"
        )
    return None


def load_index(index_path: str, *, dataset: str) -> dict[str, Any]:
    """Reads an `index.json` as a dict.

    Raises:
        DataError: naming the index, when it cannot be read or is not a JSON object.
    """
    try:
        with open(index_path, "rb") as handle:
            index = json.load(handle)
    except (OSError, ValueError) as error:
        raise DataError(
            f"cannot read the index: {error}", dataset=dataset, shard=index_path
        ) from None
    if not isinstance(index, dict):
        raise DataError("the index is not a JSON object", dataset=dataset, shard=index_path)
    return index


def shard_path(index_path: str, name: str, *, dataset: str) -> str:
    """Returns the absolute path of a shard an index lists, checking that the file exists.

    Raises:
        DataError: naming the shard, when its file is missing.
    """
    path = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(index_path)), name))
    if not os.path.isfile(path):
        raise DataError(
            f"the shard file is missing, though {INDEX_FILE} lists it", dataset=dataset, shard=path
        )
    return path
