"""Remote datasets in tests without a server: fresh memory:// folders, files written into them
by the real writers, and the cache and retry options a test's remote open takes."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq


def fresh_root() -> str:
    """A memory:// folder no other test uses (its path, without the scheme)."""
    return f"/zt-{uuid.uuid4().hex[:8]}"


def put_jsonl(fs: Any, path: str, rows: list[dict[str, Any]]) -> None:
    fs.pipe(path, "".join(json.dumps(row) + "\n" for row in rows).encode())


def put_parquet(fs: Any, path: str, table: pa.Table, **options: Any) -> None:
    with fs.open(path, "wb") as handle:
        pq.write_table(table, handle, **options)


def equal_parquet_shards(count: int) -> tuple[str, int]:
    """`count` Parquet shards of the same size in a fresh memory:// folder: (folder, size)."""
    fs = fsspec.filesystem("memory")
    root = fresh_root()
    for number in range(count):
        put_parquet(fs, f"{root}/{number}.parquet", pa.table({"n": [7] * 10}))
    return root, fs.size(f"{root}/0.parquet")


def remote_options(tmp_path: Path, max_bytes: int = 1 << 20) -> dict[str, Any]:
    """`io_options` with the shard cache under `tmp_path` and quick retries (two tries)."""
    return {
        "cache": {"dir": str(tmp_path / "cache"), "max_bytes": max_bytes},
        "retry": {"attempts": 2, "initial_delay": 0.01},
    }
