"""Real writers for the format tests: mosaicml-streaming's MDSWriter, litdata.optimize, vortex.

Other format tests import these helpers. `import streaming` imports torchvision (whose only
build for this torch fails to import), so the MDS writer module is loaded with its parent
packages stubbed out: the writer itself is mosaicml-streaming's, unchanged.
"""

from __future__ import annotations

import importlib
import importlib.util
import multiprocessing
import random
import sys
import types
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

_STREAMING_PARENTS = ("streaming", "streaming.base", "streaming.base.format")


def mds_writer_class() -> Any:
    """Returns mosaicml-streaming's `MDSWriter`, skipping the test when it is not installed."""
    if importlib.util.find_spec("streaming") is None:
        pytest.skip("mosaicml-streaming is not installed")
    for name in _STREAMING_PARENTS:
        if name not in sys.modules:
            spec = importlib.util.find_spec(name)
            assert spec is not None and spec.submodule_search_locations is not None
            package = types.ModuleType(name)
            package.__path__ = list(spec.submodule_search_locations)
            package.__spec__ = spec
            sys.modules[name] = package
    return importlib.import_module("streaming.base.format.mds.writer").MDSWriter


def write_mds(
    out: Path,
    rows: Sequence[dict[str, Any]],
    columns: dict[str, str],
    *,
    compression: str | None = None,
    size_limit: int = 1 << 16,
    hashes: Sequence[str] = (),
) -> Path:
    """Writes rows with `MDSWriter` (recording `hashes` of each shard); returns the dataset
    directory."""
    writer_class = mds_writer_class()
    with writer_class(
        out=str(out),
        columns=columns,
        compression=compression,
        size_limit=size_limit,
        hashes=sorted(hashes),
    ) as writer:
        for row in rows:
            writer.write(row)
    return out


def _identity(item: Any) -> Any:
    return item


def write_litdata(
    out: Path,
    items: Sequence[Any],
    *,
    chunk_bytes: int = 1 << 14,
    fn: Callable[[Any], Any] = _identity,
    **options: Any,
) -> Path:
    """Writes items with `litdata.optimize` (one forked worker); returns the directory.

    optimize sets the process-wide multiprocessing start method; the previous one is restored.
    """
    litdata = pytest.importorskip("litdata")
    previous = multiprocessing.get_start_method(allow_none=True)
    try:
        litdata.optimize(
            fn=fn,
            inputs=list(items),
            output_dir=str(out),
            chunk_bytes=chunk_bytes,
            num_workers=1,
            start_method="fork",
            mode="overwrite",
            verbose=False,
            **options,
        )
    finally:
        multiprocessing.set_start_method(previous, force=True)
    return out


def tokens_loader() -> Any:
    """Returns a new litdata `TokensLoader`."""
    pytest.importorskip("litdata")
    return importlib.import_module("litdata.streaming.item_loader").TokensLoader()


def write_vortex(path: Path, table: pa.Table) -> Path:
    """Writes a table as one Vortex file."""
    vortex = pytest.importorskip("vortex")
    path.parent.mkdir(parents=True, exist_ok=True)
    vortex.io.write(table, str(path))
    return path


def sample_rows(count: int) -> list[dict[str, Any]]:
    """Rows with text, an int id and a non-empty int32 token array."""
    return [
        {
            "text": f"row {i} é ✓ {'x' * (i % 7)}",
            "id": i,
            "tokens": np.arange(i, i + 1 + i % 9, dtype=np.int32),
        }
        for i in range(count)
    ]


# The columns and rows the MDS format tests write (text, an int id, int32 tokens).
MDS_COLUMNS = {"text": "str", "id": "int", "tokens": "ndarray:int32"}
MDS_ROWS = sample_rows(120)


def plain(row: dict[str, Any]) -> dict[str, Any]:
    """A row with numpy arrays turned into (dtype, nested lists), comparable with `==`."""
    return {
        key: (value.dtype.str, value.tolist()) if isinstance(value, np.ndarray) else value
        for key, value in row.items()
    }


def assert_threads_read_like_one(make: Callable[[], Any], asks: int = 200) -> None:
    """Eight threads reading random rows of a fresh dataset get what one thread got."""
    serial, threaded = make(), make()
    rng = random.Random(0)
    shards = [rng.randrange(len(serial.shards)) for _ in range(asks)]
    work = [
        (shard, [rng.randrange(serial.shards[shard].num_rows) for _ in range(7)])
        for shard in shards
    ]

    def read(dataset: Any, ask: tuple[int, list[int]]) -> list[dict[str, Any]]:
        return [plain(row) for row in dataset.read_rows(*ask)]

    expected = [read(serial, ask) for ask in work]
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(lambda ask: read(threaded, ask), work)) == expected


def test_the_mds_writer_loads_without_torchvision(tmp_path: Path) -> None:
    out = write_mds(tmp_path / "mds", sample_rows(3), {"text": "str", "id": "int"})
    assert (out / "index.json").is_file()
    assert "torchvision" not in sys.modules


def test_litdata_optimize_leaves_the_start_method_as_it_found_it(tmp_path: Path) -> None:
    before = multiprocessing.get_start_method()
    write_litdata(tmp_path / "ld", [{"id": i} for i in range(3)])
    assert multiprocessing.get_start_method() == before
