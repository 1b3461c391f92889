"""A fault of the machine while a healthy shard is opened or decoded (too many open files, no
memory, an I/O error) is raised as it is, not as a `DataError` saying the shard is unreadable
or corrupt, which sent the user to rebuild good data (review L, finding 1)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.unit.io.test_io_formats_writers import write_litdata, write_mds
from zephon_torch.io._rows import machine_fault, rust_machine_fault

# In a child process (the limit is its own): open the dataset and copy it as a DataLoader
# worker gets it (no file open yet), take every descriptor the limit leaves, read a shard,
# then free them and read it again.
_CHILD = textwrap.dedent(
    """
    import json, os, pickle, resource, sys
    from zephon_torch.io import Dataset
    dataset = pickle.loads(pickle.dumps(Dataset.from_path("d", sys.argv[1])))
    last = len(dataset.shards) - 1
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    held = []
    try:
        while True:
            held.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        pass
    try:
        dataset.read_rows(last, [0])
        seen = "read"
    except Exception as error:
        seen = f"{type(error).__name__}: {error}"
    for fd in held:
        os.close(fd)
    again = dataset.read_rows(last, [0])
    print(json.dumps({"seen": seen, "again": len(again)}))
    """
)


def _child(code: str, folder: Path) -> dict[str, Any]:
    """What the child process running ``code`` over ``folder`` printed last, as JSON."""
    child = subprocess.run(
        [sys.executable, "-c", code, str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=Path(__file__).parents[3],
    )
    assert child.returncode == 0, child.stderr[-2000:]
    return json.loads(child.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _write(folder: Path, kind: str) -> Path:
    rows = [{"text": f"document {i}"} for i in range(40)]
    if kind == "parquet":
        folder.mkdir()
        for number in range(2):
            table = pa.table({"text": [r["text"] for r in rows[number * 20 : number * 20 + 20]]})
            pq.write_table(table, folder / f"{number}.parquet")
    elif kind == "npy":
        folder.mkdir()
        for number in range(2):
            np.save(folder / f"part-{number}.npy", np.arange(10, dtype=np.int32).reshape(2, 5))
    elif kind == "vortex":
        vortex = pytest.importorskip("vortex")  # vortex-data: Python 3.11+

        folder.mkdir()
        for number in range(2):
            table = pa.table({"text": [r["text"] for r in rows[number * 20 : number * 20 + 20]]})
            vortex.io.write(vortex.array(table), str(folder / f"{number}.vortex"))
    elif kind == "mds":
        write_mds(folder, rows, {"text": "str"}, size_limit=1 << 9)
    else:
        write_litdata(folder, [r["text"] for r in rows], chunk_bytes=1 << 9)
    return folder


@pytest.mark.parametrize("kind", ["parquet", "npy", "mds", "litdata", "vortex"])
def test_too_many_open_files_is_not_reported_as_a_corrupt_shard(tmp_path: Path, kind: str) -> None:
    result = _child(_CHILD, _write(tmp_path / kind, kind))
    assert result["again"] == 1  # the shard was healthy all along
    assert not result["seen"].startswith("DataError"), result["seen"]
    assert "Too many open files" in result["seen"]


def test_a_format_library_s_own_os_error_is_the_data_s() -> None:
    assert machine_fault(MemoryError())
    assert machine_fault(OSError(24, "Too many open files"))
    assert machine_fault(PermissionError(13, "Permission denied"))
    assert not machine_fault(OSError("Couldn't deserialize thrift"))  # pyarrow, bad bytes
    assert not machine_fault(FileNotFoundError(2, "No such file"))
    assert not machine_fault(ValueError("bad magic"))
    # vortex-data's Rust errors carry the errno in their text only
    fault = rust_machine_fault(RuntimeError("opening: Too many open files (os error 24)\nat"))
    assert fault is not None and fault.errno == 24 and machine_fault(fault)
    assert "(opening: Too many open files (os error 24))" in str(fault)
    assert rust_machine_fault(RuntimeError("No such file (os error 2)")) is None
    assert rust_machine_fault(RuntimeError("invalid magic bytes")) is None


# In a child process: a row group of 300 strings of 1 MB (a few KB on disk) decoded under an
# address-space limit 20 MiB above what the process holds (a small shard read first, so that
# pyarrow's threads are started), then without it.
_DECODE_CHILD = textwrap.dedent(
    """
    import json, os, resource, sys
    from zephon_torch.io import Dataset
    dataset = Dataset.from_path("d", sys.argv[1])
    dataset.read_rows(1, [0])
    status = open(f"/proc/{os.getpid()}/status").read()
    held = int(status.split("VmSize:")[1].split()[0]) * 1024
    limit = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (held + (20 << 20), limit[1]))
    try:
        dataset.read_rows(0, [0])
        seen = "read"
    except Exception as error:
        seen = f"{type(error).__name__}: {error}"
    resource.setrlimit(resource.RLIMIT_AS, limit)
    again = dataset.read_rows(0, [299])
    print(json.dumps({"seen": seen, "again": len(again[0]["text"])}))
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_no_memory_to_decode_a_parquet_row_group_is_not_reported_as_a_corrupt_shard(
    tmp_path: Path,
) -> None:
    """pyarrow's ArrowMemoryError is an ArrowException: the decode's handler of bad bytes
    called the healthy shard's row group undecodable."""
    table = pa.table({"text": ["x" * 1_000_000 + str(i) for i in range(300)]})
    pq.write_table(table, tmp_path / "0-big.parquet", compression="zstd")
    pq.write_table(pa.table({"text": ["a", "b"], "n": [1, 2]}), tmp_path / "1-small.parquet")
    result = _child(_DECODE_CHILD, tmp_path)
    assert result["again"] == 1_000_003  # the shard was healthy all along
    assert result["seen"].startswith(("ArrowMemoryError", "MemoryError")), result["seen"]
