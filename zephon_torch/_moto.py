"""A moto S3 server on loopback, for the tests and benchmarks that read from S3.

Started as its own process (``python -m moto.server``) on a free port, with dummy credentials;
the tests and ``benchmarks/remote.py`` use it to read through the real s3fs client. Needs the
dev extras (moto, boto3). ``serving`` runs any such server (the tests' GCS and Azure emulators).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# a safety net while the server lives (one that exits is reported at once): Python servers
# import for 10-40 s on a loaded two-core machine
START_S = 120.0


@contextmanager
def moto_server(
    env: dict[str, str] | None = None,
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Yields the endpoint URL of a fresh moto server and its process (killed on exit); `env`
    adds to its environment (moto's `INITIAL_NO_AUTH_ACTION_COUNT` turns on access checks).

    Raises:
        RuntimeError: when it does not accept connections within ``START_S`` seconds.
    """
    port = free_port()
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", **(env or {})}
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    with serving(command, port, env=env) as server:
        yield f"http://127.0.0.1:{port}", server


def free_port() -> int:
    """A loopback port free now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def serving(
    command: list[str], port: int, *, env: dict[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """Runs the server `command` until it accepts connections on loopback `port`, yields its
    process, and kills it on exit.

    Raises:
        RuntimeError: when it does not accept connections within ``START_S`` seconds.
    """
    server = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    try:
        deadline = time.monotonic() + START_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                code = server.poll()
                if code is not None:
                    said = f"{command[0]} exited with code {code} before serving"
                    raise RuntimeError(said) from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{command[0]} did not serve in {START_S:.0f} s") from None
                time.sleep(0.1)
        yield server
    finally:
        server.kill()
        server.wait(10)


def client(endpoint: str) -> Any:
    """A boto3 S3 client of the server at ``endpoint``."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="x",
        aws_secret_access_key="x",
        region_name="us-east-1",
    )


def upload(endpoint: str, folder: Path, bucket: str, prefix: str) -> int:
    """Uploads every file of ``folder`` under ``s3://bucket/prefix/`` (creating the bucket
    if needed); returns the bytes sent."""
    s3 = client(endpoint)
    if bucket not in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
        s3.create_bucket(Bucket=bucket)
    sent = 0
    for file in sorted(folder.iterdir()):
        s3.upload_file(str(file), bucket, f"{prefix}/{file.name}")
        sent += file.stat().st_size
    return sent
