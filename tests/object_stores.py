"""Google Cloud Storage and Azure Blob Storage emulators on loopback, for `gs://` and `az://`.

Each runs as its own process on a free port and is killed on exit: `gcp-storage-emulator`
(a pip package, in the dev extras) for GCS, read through the real gcsfs client, and Azurite
(Microsoft's emulator, installed with npm into `.azurite/` by the Makefile) for Azure, read
through the real adlfs client. `Store` gives the URL, the storage options and an upload for
each, so a test reads either one the same way. The S3 tests (moto, see `tests/conftest.py`)
share the rest: storage options, a corpus written in a format, its rows, and a read that dies
naming a URL.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.unit.io.test_io_formats_writers import (
    MDS_COLUMNS,
    plain,
    sample_rows,
    write_litdata,
    write_mds,
    write_vortex,
)
from zephon_torch._moto import free_port, serving
from zephon_torch.errors import StorageError
from zephon_torch.io import Dataset

# gcsfs asks a GCS endpoint over gRPC whether a bucket is zonal or hierarchical, which the
# emulator does not serve (a 60 s timeout per bucket); read when gcsfs is first imported.
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"

AZURITE = (
    Path(__file__).resolve().parents[1] / ".azurite" / "node_modules" / ".bin" / "azurite-blob"
)
# Azurite's well-known development account (public, documented with the emulator)
AZURE_ACCOUNT = "devstoreaccount1"
AZURE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


@dataclass
class Store:
    """A running emulator: `url(bucket, prefix)` for `Dataset.from_path`, `options` its
    `storage_options`, `process` to kill it."""

    scheme: str
    process: subprocess.Popen[bytes]
    options: dict[str, Any]

    def url(self, bucket: str, prefix: str) -> str:
        return f"{self.scheme}://{bucket}/{prefix}"

    def filesystem(self) -> Any:
        import fsspec

        return fsspec.filesystem("gcs" if self.scheme == "gs" else "az", **self.options)

    def upload(self, folder: Path, bucket: str, prefix: str) -> None:
        """Every file of `folder` under `bucket/prefix/` (the bucket made if needed)."""
        fs = self.filesystem()
        if not fs.exists(bucket):
            fs.mkdir(bucket)
        for file in sorted(folder.iterdir()):
            fs.put_file(str(file), f"{bucket}/{prefix}/{file.name}")


@contextmanager
def gcs_store() -> Iterator[Store]:
    """A fresh in-memory GCS emulator, read anonymously through gcsfs."""
    port = free_port()
    command = [sys.executable, "-m", "gcp_storage_emulator", "start"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--in-memory"]
    with serving(command, port) as process:
        options = {
            "endpoint_url": f"http://127.0.0.1:{port}",
            "token": "anon",
            "project": "test",
            "skip_instance_cache": True,
        }
        yield Store("gs", process, options)


@contextmanager
def azure_store() -> Iterator[Store]:
    """A fresh in-memory Azurite blob service, read with the development account's key."""
    if not AZURITE.exists():
        raise RuntimeError(f"Azurite is not installed at {AZURITE}: run `make install`")
    port = free_port()
    command = [str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(port)]
    command += ["--inMemoryPersistence", "--silent", "--disableTelemetry", "--skipApiVersionCheck"]
    with serving(command, port) as process:
        connection = (
            f"DefaultEndpointsProtocol=http;AccountName={AZURE_ACCOUNT};AccountKey={AZURE_KEY};"
            f"BlobEndpoint=http://127.0.0.1:{port}/{AZURE_ACCOUNT};"
        )
        options = {"connection_string": connection, "skip_instance_cache": True}
        yield Store("az", process, options)


# Helpers the S3 and other object-store tests share.


def s3_storage(endpoint: str) -> dict[str, Any]:
    """s3fs storage options for moto at `endpoint`: one try per request, short timeouts."""
    return {
        "key": "x",
        "secret": "x",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        "config_kwargs": {
            "retries": {"max_attempts": 1},
            "connect_timeout": 1,
            "read_timeout": 2,
        },
        "skip_instance_cache": True,
    }


def write_corpus(folder: Path, kind: str, shards: int = 4, rows: int = 50) -> None:
    """`shards` files of `rows` documents each (text, id) as jsonl, parquet or vortex."""
    folder.mkdir()
    for shard in range(shards):
        docs = [
            {"text": f"shard {shard} doc {i} " * 8, "id": shard * rows + i} for i in range(rows)
        ]
        if kind == "jsonl":
            lines = "".join(json.dumps(doc) + "\n" for doc in docs)
            (folder / f"part-{shard:03d}.jsonl").write_text(lines)
        elif kind == "vortex":
            write_vortex(folder / f"part-{shard:03d}.vortex", pa.Table.from_pylist(docs))
        else:
            pq.write_table(pa.Table.from_pylist(docs), folder / f"part-{shard:03d}.parquet")


def write_format(folder: Path, kind: str, rows: int = 120) -> Path:
    """Writes `rows` rows, several shards, with the format's real writer: MDS (`mds`,
    `mds-zstd`), LitData (`litdata`), or `.npy` (`npy`: two 1-D token files with offsets and
    one 2-D file)."""
    data = sample_rows(rows)
    if kind in ("mds", "mds-zstd"):
        compression = "zstd" if kind == "mds-zstd" else None
        return write_mds(folder, data, MDS_COLUMNS, compression=compression, size_limit=1 << 11)
    if kind == "litdata":
        return write_litdata(folder, data, chunk_bytes=1 << 11)
    folder.mkdir()
    arrays = [row["tokens"] for row in data]
    for number, part in enumerate((arrays[: rows // 3], arrays[rows // 3 : 2 * rows // 3])):
        np.save(folder / f"{number}.npy", np.concatenate(part))
        np.save(folder / f"{number}.offsets.npy", np.cumsum([0] + [len(a) for a in part]))
    np.save(folder / "2.npy", np.arange(rows // 3 * 5, dtype=np.uint16).reshape(-1, 5))
    return folder


def all_rows(dataset: Dataset) -> list[list[dict[str, Any]]]:
    """Every row of `dataset`, shard by shard."""
    return [
        dataset.read_rows(number, list(range(shard.num_rows)))
        for number, shard in enumerate(dataset.shards)
    ]


def plain_rows(dataset: Dataset) -> list[list[dict[str, Any]]]:
    """Every row of `dataset`, shard by shard, with numpy arrays made comparable (`plain`)."""
    return [[plain(row) for row in shard] for shard in all_rows(dataset)]


def dies_naming(
    remote: Dataset, server: subprocess.Popen[bytes], url: str, *, bound: float
) -> None:
    """Shard 0 read, the server killed: reading shard 1 raises a StorageError naming `url`
    within `bound` seconds, and shard 0, cached, still reads."""
    assert remote.read_rows(0, [0])[0]["id"] == 0
    server.kill()
    server.wait(10)
    start = time.monotonic()
    with pytest.raises(StorageError) as caught:
        remote.read_rows(1, [0])
    assert time.monotonic() - start < bound
    assert caught.value.url == url
    assert remote.read_rows(0, [1])[0]["id"] == 1
