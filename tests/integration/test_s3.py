"""Datasets on S3, served by moto's standalone server on loopback: same rows, bounded cache,
and a dead endpoint that fails with a StorageError after bounded retries instead of hanging."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon_torch.errors import StorageError
from zephon_torch.io import Dataset

boto3 = pytest.importorskip("boto3")
pytest.importorskip("s3fs")
pytest.importorskip("moto.server")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def s3_server() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = _free_port()
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x"}
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                pytest.fail("moto server did not start")
            time.sleep(0.1)
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.kill()
        server.wait(10)


def _storage(endpoint: str) -> dict[str, Any]:
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


def _upload(endpoint: str, local: Path, bucket: str, prefix: str) -> None:
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="x",
        aws_secret_access_key="x",
        region_name="us-east-1",
    )
    client.create_bucket(Bucket=bucket)
    for file in sorted(local.iterdir()):
        client.upload_file(str(file), bucket, f"{prefix}/{file.name}")


def _write_corpus(folder: Path, kind: str, shards: int = 4, rows: int = 50) -> None:
    folder.mkdir()
    for shard in range(shards):
        docs = [
            {"text": f"shard {shard} doc {i} " * 8, "id": shard * rows + i} for i in range(rows)
        ]
        if kind == "jsonl":
            lines = "".join(json.dumps(doc) + "\n" for doc in docs)
            (folder / f"part-{shard:03d}.jsonl").write_text(lines)
        else:
            pq.write_table(pa.Table.from_pylist(docs), folder / f"part-{shard:03d}.parquet")


def _all_rows(dataset: Dataset) -> list[list[dict[str, Any]]]:
    return [
        dataset.read_rows(number, list(range(shard.num_rows)))
        for number, shard in enumerate(dataset.shards)
    ]


def _cache_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file() and p.name[0] != ".")


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_an_s3_prefix_reads_the_same_rows_as_the_local_copy(
    s3_server: tuple[str, Any], tmp_path: Path, kind: str
) -> None:
    endpoint, _ = s3_server
    _write_corpus(tmp_path / "local", kind)
    _upload(endpoint, tmp_path / "local", "bucket", "corpus")
    options = {"cache": {"dir": str(tmp_path / "cache")}}
    remote = Dataset.from_path(
        "c", "s3://bucket/corpus/", storage_options=_storage(endpoint), io_options=options
    )
    local = Dataset.from_path("c", tmp_path / "local", index_cache_dir=str(tmp_path / "idx"))
    assert remote.format == kind
    assert remote.shards[0].path == f"s3://bucket/corpus/part-000.{kind}"
    assert remote.fingerprint() == local.fingerprint()
    assert _all_rows(remote) == _all_rows(local)


def test_a_cache_smaller_than_the_dataset_never_exceeds_its_limit(
    s3_server: tuple[str, Any], tmp_path: Path
) -> None:
    endpoint, _ = s3_server
    _write_corpus(tmp_path / "local", "jsonl", shards=6)
    _upload(endpoint, tmp_path / "local", "bucket", "small")
    shard_size = max(f.stat().st_size for f in (tmp_path / "local").iterdir())
    limit = 2 * shard_size + 10
    cache = tmp_path / "cache"
    options = {"cache": {"dir": str(cache), "max_bytes": limit}}
    remote = Dataset.from_path(
        "c", "s3://bucket/small", storage_options=_storage(endpoint), io_options=options
    )
    local = Dataset.from_path("c", tmp_path / "local", index_cache_dir=str(tmp_path / "idx"))
    assert _cache_bytes(cache) <= limit
    for number, shard in enumerate(remote.shards):
        rows = list(range(shard.num_rows))
        assert remote.read_rows(number, rows) == local.read_rows(number, rows)
        assert _cache_bytes(cache) <= limit


def test_a_dead_endpoint_raises_a_storage_error_naming_the_url_in_bounded_time(
    s3_server: tuple[str, subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    endpoint, server = s3_server
    _write_corpus(tmp_path / "local", "parquet", shards=3)
    _upload(endpoint, tmp_path / "local", "bucket", "dying")
    options = {
        "cache": {"dir": str(tmp_path / "cache")},
        "retry": {"attempts": 2, "initial_delay": 0.1, "timeout": 10},
    }
    remote = Dataset.from_path(
        "c", "s3://bucket/dying", storage_options=_storage(endpoint), io_options=options
    )
    assert remote.read_rows(0, [0])[0]["id"] == 0
    server.kill()
    server.wait(10)
    start = time.monotonic()
    with pytest.raises(StorageError) as caught:
        remote.read_rows(1, [0])
    assert time.monotonic() - start < 30
    assert caught.value.url == "s3://bucket/dying/part-001.parquet"
    assert remote.read_rows(0, [1])[0]["id"] == 1  # cached shards still read


def test_a_pipeline_over_s3_gives_the_batches_of_the_local_copy_and_prefetches(
    s3_server: tuple[str, Any], tmp_path: Path, tokenizer: Any
) -> None:
    from tests.helpers import keys
    from zephon_torch import Pipeline
    from zephon_torch.work import StaticMixtureWorkSource, TokenEstimation

    endpoint, _ = s3_server
    _write_corpus(tmp_path / "local", "jsonl", shards=6, rows=30)
    _upload(endpoint, tmp_path / "local", "bucket", "corpus")
    cache = tmp_path / "cache"
    remote = Dataset.from_path(
        "c",
        "s3://bucket/corpus/",
        storage_options=_storage(endpoint),
        io_options={"cache": {"dir": str(cache)}},
    )
    local = Dataset.from_path("c", tmp_path / "local", index_cache_dir=str(tmp_path / "idx"))

    def build(dataset: Dataset) -> Pipeline:
        source = StaticMixtureWorkSource(
            [dataset], seed=4, token_estimation=TokenEstimation(), shuffle_window_shards=2
        )
        return (
            Pipeline(source)
            .options(canonical_replicas=2)
            .tokenize(tokenizer=tokenizer)
            .pack_flat(64)
            .batch(2)
        )

    over_s3 = build(remote)
    assert keys(over_s3) == keys(build(local))
    cache_stats = over_s3.stats()["cache"]
    assert cache_stats["misses"] == 6 and cache_stats["bytes_downloaded"] > 0
    assert cache_stats["hits"] > 0 and 0 < cache_stats["hit_rate"] < 1
    assert build(local).stats()["cache"] is None
    cached = [p for p in cache.rglob("*.jsonl")]
    assert len(cached) == 6
