"""`Shard`, one file of a dataset, and the fingerprint of a dataset's shard list.

The fingerprint is a pure function of the dataset's name, format, shards and hub revision: each
shard's path below the deepest folder holding them all, its row count and its window blocks,
hashed, so a changed dataset is noticed without reading data, while moving its files to another
folder or machine keeps the fingerprint. Local names count as the text of their bytes read as
UTF-8, whatever encoding Python decodes file names with there (ASCII under a C locale without
UTF-8 mode gives `é` as two surrogates).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Shard:
    """One file of a dataset (or one slice of an in-memory table).

    Args:
        path: the absolute local path, the URL of a remote shard, or `memory://<dataset>/<i>`
            for in-memory shards.
        num_rows: the number of rows; always positive.
        blocks: where the reader splits the shard for shuffle windows, the row counts of its
            blocks of consecutive rows, in order (they sum to `num_rows`); empty otherwise.
            Only Parquet shards of more than `parquet.WINDOW_BLOCK_BYTES` of row groups are
            split: a window then holds `shuffle_window_shards` blocks, not whole shards.
    """

    path: str
    num_rows: int
    blocks: tuple[int, ...] = ()


def fingerprint_of(
    dataset: str, format_: str, shards: Sequence[Shard], revision: str | None
) -> dict[str, Any]:
    """`Dataset.fingerprint` of the dataset named ``dataset``, of format ``format_``, with
    ``shards``, read at hub commit ``revision`` (see there)."""
    names = [_utf8_text(name) for name in _below_common_folder([s.path for s in shards])]
    listing = [[name, shard.num_rows] for name, shard in zip(names, shards)]
    out = {
        "name": dataset,
        "format": format_,
        "num_shards": len(shards),
        "num_rows": sum(shard.num_rows for shard in shards),
        "rows_digest": _digest(listing),
    }
    if any(shard.blocks for shard in shards):
        out["blocks_digest"] = _digest([list(shard.blocks) for shard in shards])
    if revision is not None:  # hf://: another commit is other data, names alike
        out["revision"] = revision
    return out


def _below_common_folder(paths: list[str]) -> list[str]:
    """Each of ``paths`` (files or URLs) below the deepest folder that holds them all: file
    names where they share one folder, as the fingerprint read before it told
    `lang=fr/part-0.jsonl` from `lang=it/part-0.jsonl` (the same file name)."""
    parts = [path.replace(os.sep, "/").split("/") for path in paths]
    depth, deepest = 0, min((len(p) - 1 for p in parts), default=0)
    while depth < deepest and len({p[depth] for p in parts}) == 1:
        depth += 1
    return ["/".join(p[depth:]) for p in parts]


def _utf8_text(name: str) -> str:
    """``name`` as the text of its bytes read as UTF-8 (bytes that are not UTF-8 as
    surrogates): Python's own text of a local name where it decodes names as UTF-8, and what
    that would be where it decodes them otherwise. A URL's text, which no file system gave
    and which may not encode so, is kept."""
    try:
        return os.fsencode(name).decode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return name


def _digest(value: object) -> str:
    return hashlib.sha256(json.dumps(value, separators=(",", ":")).encode()).hexdigest()[:16]
