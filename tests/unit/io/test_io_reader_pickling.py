"""Every shard reader keeps each of its settings through a pickle (a DataLoader worker's copy, a
spawned processes runner's). Readers list the settings they pickle by hand, leaving their open
files and caches behind: a constructor argument left off that list would silently take its
default in every worker (review L, finding 2)."""

from __future__ import annotations

import gzip
import inspect
import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import memory_copy
from tests.unit.io.test_io_formats_writers import write_litdata, write_mds
from zephon_torch.io import Dataset

# constructor arguments stored under another attribute name
_ATTRIBUTE = {"format_": "format"}
# a remote reader's shortcuts for its first open, not settings: the index's bytes read once
# already (its download skips them), and the file system (made again from the options)
_TRANSIENT = {"index_data", "fs"}


def _write(folder: Path, kind: str) -> Path:
    rows = [{"text": f"document {i}"} for i in range(12)]
    if kind == "mds":
        return write_mds(folder, rows, {"text": "str"})
    if kind == "litdata":
        return write_litdata(folder, [r["text"] for r in rows])
    folder.mkdir()
    if kind in ("jsonl", "jsonl.gz"):
        text = "".join(json.dumps(r) + "\n" for r in rows).encode()
        (folder / f"a.{kind}").write_bytes(gzip.compress(text) if kind == "jsonl.gz" else text)
    elif kind == "parquet":
        pq.write_table(pa.table({"text": [r["text"] for r in rows]}), folder / "a.parquet")
    elif kind == "npy":
        np.save(folder / "a.npy", np.arange(24, dtype=np.int32).reshape(12, 2))
    elif kind == "vortex":
        vortex = pytest.importorskip("vortex")
        vortex.io.write(pa.table({"text": [r["text"] for r in rows]}), str(folder / "a.vortex"))
    return folder


def _settings_kept(reader: Any) -> None:
    clone = pickle.loads(pickle.dumps(reader))
    assert type(clone) is type(reader)
    for name in inspect.signature(type(reader).__init__).parameters:
        if name == "self" or name in _TRANSIENT:
            continue
        attribute = _ATTRIBUTE.get(name, name)
        assert hasattr(reader, attribute), f"{type(reader).__name__} keeps {name!r} elsewhere"
        kept, original = getattr(clone, attribute), getattr(reader, attribute)
        assert _same(kept, original), (
            f"{type(reader).__name__}.{attribute} after a pickle: {kept!r}, not {original!r}"
        )


def _same(kept: Any, original: Any) -> bool:
    """Equal, or (functions, arrays) equal in what they show."""
    try:
        return bool(kept == original)
    except ValueError:  # holds arrays
        return repr(kept) == repr(original)


@pytest.mark.parametrize(
    "kind", ["jsonl", "jsonl.gz", "parquet", "npy", "mds", "litdata", "vortex"]
)
def test_every_reader_keeps_its_settings_through_a_pickle(tmp_path: Path, kind: str) -> None:
    folder = _write(tmp_path / "data", kind)
    local = Dataset.from_path("d", folder, index_cache_dir=str(tmp_path / "i1"))
    _settings_kept(local._reader)
    options = {"cache": {"dir": str(tmp_path / "cache"), "max_bytes": 1 << 20}}
    remote = Dataset.from_path(
        "d", memory_copy(folder), io_options=options, index_cache_dir=str(tmp_path / "i2")
    )
    _settings_kept(remote._reader)
    copied = pickle.loads(pickle.dumps(remote)).read_rows(0, [0, 5])
    assert repr(copied) == repr(local.read_rows(0, [0, 5]))  # rows of arrays (npy) too
