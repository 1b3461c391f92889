"""Google Cloud Storage and Azure Blob Storage emulators on loopback, for `gs://` and `az://`.

Each runs as its own process on a free port and is killed on exit: `gcp-storage-emulator`
(a pip package, in the dev extras) for GCS, read through the real gcsfs client, and Azurite
(Microsoft's emulator, installed with npm into `.azurite/` by the Makefile) for Azure, read
through the real adlfs client. `Store` gives the URL, the storage options and an upload for
each, so a test reads either one the same way.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zephon_torch._moto import free_port, serving

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
