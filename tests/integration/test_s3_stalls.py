"""Shard downloads from S3 (moto on loopback) that stall are cut short, and healthy ones that
s3fs reports in parts are not: the retry policy's `min_rate` and `rate_window`."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.hooked_proxy import hooked_proxy
from zephon_torch._moto import moto_server, upload
from zephon_torch.errors import StorageError
from zephon_torch.io import Dataset

pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

_ROWS = 3000


@pytest.fixture
def corpus(tmp_path: Path) -> Iterator[tuple[str, Any, Path]]:
    """A bucket holding two JSONL shards of about 1.2 MB each; yields the endpoint, the server
    process and the local folder."""
    local = tmp_path / "local"
    local.mkdir()
    for shard in range(2):
        rows = [{"text": f"shard {shard} row {i} " + "x" * 380} for i in range(_ROWS)]
        (local / f"part-{shard}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with moto_server() as (endpoint, server):
        upload(endpoint, local, "bucket", "d")
        yield endpoint, server, local


def _open(
    endpoint: str, tmp_path: Path, retry: dict[str, Any], cache: str = "cache", **storage: Any
) -> Dataset:
    options = {
        "key": "x",
        "secret": "x",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        "skip_instance_cache": True,
        **storage,
    }
    io_options = {"cache": {"dir": str(tmp_path / cache), "prefetch_bytes": 0}, "retry": retry}
    return Dataset.from_path(
        "d",
        "s3://bucket/d",
        storage_options=options,
        io_options=io_options,
        index_cache_dir=str(tmp_path / "index"),
    )


def test_a_healthy_download_that_s3fs_reports_in_parts_is_not_taken_for_a_stall(
    corpus: tuple[str, Any, Path], tmp_path: Path
) -> None:
    """s3fs downloads an object larger than its block size in parallel parts and reports the
    bytes once per batch of parts: a download whose parts each took longer than `rate_window`
    had been cut short as bringing nothing, so a healthy large shard on a slow link failed
    (a review). Here each part's answer waits 1.5 s, three times the window."""
    endpoint, _, _ = corpus

    def slow_parts(method: str, path: str, headers: dict[str, str]) -> None:
        if method == "GET" and "Range" in headers:
            time.sleep(1.5)

    retry = {"attempts": 1, "min_rate": 1000, "rate_window": 0.5}
    with hooked_proxy(endpoint, slow_parts) as proxy:
        # JSONL shards are downloaded whole to be counted at the open: that is the read here
        dataset = _open(proxy, tmp_path, retry, default_block_size=1 << 19)
    assert [shard.num_rows for shard in dataset.shards] == [_ROWS, _ROWS]
    assert dataset.read_rows(1, [_ROWS - 1])[0]["text"].startswith(f"shard 1 row {_ROWS - 1} ")


def test_a_download_waiting_for_a_pooled_connection_is_not_taken_for_a_stall(
    corpus: tuple[str, Any, Path], tmp_path: Path
) -> None:
    """A download whose request waited for one of the client's pooled connections, held by
    another download, was judged over the wait and cut as bringing nothing (a review). Here
    the pool holds one connection, the open counts both shards at once, and each GET's
    answer waits 1.5 s, three times the window."""
    endpoint, _, _ = corpus

    def slow_gets(method: str, path: str, headers: dict[str, str]) -> None:
        if method == "GET" and path.split("?", maxsplit=1)[0].endswith(".jsonl"):
            time.sleep(1.5)

    retry = {"attempts": 1, "min_rate": 1000, "rate_window": 0.5}
    with hooked_proxy(endpoint, slow_gets) as proxy:
        dataset = _open(proxy, tmp_path, retry, config_kwargs={"max_pool_connections": 1})
    assert [shard.num_rows for shard in dataset.shards] == [_ROWS, _ROWS]


def test_a_stopped_server_ends_a_download_at_its_deadline(
    corpus: tuple[str, Any, Path], tmp_path: Path
) -> None:
    """s3fs's own timeouts and retries held a download from a stopped server for 420 s with
    every default (design.md); it is now cut at `rate_window + size / min_rate`."""
    endpoint, server, local = corpus
    size = local.joinpath("part-1.jsonl").stat().st_size
    assert size > 1 << 20
    retry = {"attempts": 2, "initial_delay": 0.01, "timeout": 5, "rate_window": 1}
    _open(endpoint, tmp_path, {"min_rate": 0})  # counts the rows, which later opens remember
    retry["min_rate"] = size  # a deadline of 2 s
    dataset = _open(endpoint, tmp_path, retry, cache="other")  # another node: nothing cached
    os.kill(server.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(StorageError, match=r"after 2 attempt.*past the 2\.0 s its size"):
            dataset.read_rows(1, [0])
        assert time.monotonic() - started < 10
    finally:
        os.kill(server.pid, signal.SIGCONT)


def test_a_store_that_stops_answering_after_a_download_ends_its_check_in_bounded_time(
    corpus: tuple[str, Any, Path], tmp_path: Path
) -> None:
    """A finished download is checked against its listing (a HEAD, then a listing of the
    object). A store frozen at that moment held the HEAD for s3fs's own timeouts and retries:
    over 9 minutes with its defaults on two torchrun ranks, the object's lock held all the
    while and the other rank waiting on it. The whole check now takes at most the policy's
    `timeout` (4 s here), and ends in a StorageError naming the URL. Here the shard's GET is
    answered without its ETag (which, where it is the listed one, makes the check needless),
    and every request after it waits until the test ends."""
    endpoint, _, local = corpus
    _open(endpoint, tmp_path, {"min_rate": 0})  # counts the rows, which later opens remember
    frozen, release = [], threading.Event()

    def freeze_after_the_download(
        method: str, path: str, headers: dict[str, str]
    ) -> tuple[int, bytes] | None:
        if frozen:
            release.wait(120)
        elif method == "GET" and path.split("?", maxsplit=1)[0].endswith("part-1.jsonl"):
            frozen.append(path)  # the download completes
            return 200, (local / "part-1.jsonl").read_bytes()
        return None

    retry = {"attempts": 3, "initial_delay": 0.01, "timeout": 4, "rate_window": 1}
    try:
        with hooked_proxy(endpoint, freeze_after_the_download) as proxy:
            dataset = _open(proxy, tmp_path, retry, cache="other")  # another node's cache
            started = time.monotonic()
            with pytest.raises(StorageError) as caught:
                dataset.read_rows(1, [0])
            took = time.monotonic() - started
            release.set()
    finally:
        release.set()
    assert frozen, "the download was never asked for"
    assert caught.value.url == "s3://bucket/d/part-1.jsonl"
    assert "listing" in str(caught.value) and "stalled" in str(caught.value)
    assert took < 30, took  # not s3fs's 60 s timeouts, retried
