"""Fixtures for the io tests: real files written with json, gzip, zstandard and pyarrow, and a
folder served over http on loopback."""

from __future__ import annotations

import functools
import gzip
import http.server
import io
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from tests.loopback import serve_in_thread


@pytest.fixture(autouse=True)
def _every_test_has_a_private_cache(private_cache: Path) -> None:
    """Keeps every test's default index cache out of the home folder."""


@pytest.fixture
def http_folder(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A folder served by python's http.server on loopback (no ETag, no range requests)."""
    folder = tmp_path / "served"
    folder.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    with serve_in_thread(handler) as url:
        yield folder, url


def encode_lines(text: str | bytes, compression: str | None) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    if compression == "gzip":
        return gzip.compress(data)
    if compression == "zstd":
        # A streamed frame has no content size in its header, as zstd's CLI writes for pipes.
        buffer = io.BytesIO()
        with zstandard.ZstdCompressor().stream_writer(buffer, closefd=False) as writer:
            writer.write(data)
        return buffer.getvalue()
    return data


WriteJsonl = Callable[..., Path]


@pytest.fixture
def write_jsonl() -> WriteJsonl:
    """Writes rows (or raw text) as a JSONL file, optionally gzip or zstd compressed."""

    def write(
        path: Path,
        rows: Sequence[dict[str, Any]] | None = None,
        *,
        text: str | bytes | None = None,
        compression: str | None = None,
    ) -> Path:
        if text is None:
            text = "".join(json.dumps(row) + "\n" for row in rows or [])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(encode_lines(text, compression))
        return path

    return write


WriteParquet = Callable[..., Path]


@pytest.fixture
def write_parquet() -> WriteParquet:
    """Writes rows as a Parquet file with the given row group size."""

    def write(path: Path, rows: Sequence[dict[str, Any]], *, row_group_size: int = 1000) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(list(rows)), path, row_group_size=row_group_size)
        return path

    return write


def make_rows(count: int, start: int = 0) -> list[dict[str, Any]]:
    """Rows with an int, a unicode string, a list and a nested object."""
    return [
        {
            "id": i,
            "text": f"row {i} é ✓ {'x' * (i % 7)}",
            "tags": [i % 3, i % 5],
            "meta": {"even": i % 2 == 0},
        }
        for i in range(start, start + count)
    ]


@pytest.fixture
def rows_factory() -> Callable[..., list[dict[str, Any]]]:
    return make_rows
