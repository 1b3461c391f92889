"""Datasets on S3, served by moto's standalone server on loopback: the same rows and batches as
the local copy in every format (MDS, LitData and `.npy` written by their real writers), a bounded
cache, prefetch of `.npy` offsets, and a damaged shard or index named by its URL."""

from __future__ import annotations

import json
import pickle
import time
from pathlib import Path
from typing import Any

import pytest

from tests.object_stores import all_rows, plain_rows, s3_storage, write_corpus, write_format
from tests.unit.io.test_io_formats_writers import plain
from zephon_torch._moto import client, upload
from zephon_torch.errors import DataError
from zephon_torch.io import Dataset

boto3 = pytest.importorskip("boto3")
pytest.importorskip("s3fs")
pytest.importorskip("moto.server")

pytestmark = pytest.mark.usefixtures("private_cache")


def _cache_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file() and p.name[0] != ".")


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "vortex"])
def test_an_s3_prefix_reads_the_same_rows_as_the_local_copy(
    s3_server: tuple[str, Any], tmp_path: Path, kind: str
) -> None:
    endpoint, _ = s3_server
    write_corpus(tmp_path / "local", kind)
    upload(endpoint, tmp_path / "local", "bucket", "corpus")
    options = {"cache": {"dir": str(tmp_path / "cache")}}
    remote = Dataset.from_path(
        "c", "s3://bucket/corpus/", storage_options=s3_storage(endpoint), io_options=options
    )
    local = Dataset.from_path("c", tmp_path / "local", index_cache_dir=str(tmp_path / "idx"))
    assert remote.format == kind
    assert remote.shards[0].path == f"s3://bucket/corpus/part-000.{kind}"
    assert remote.fingerprint() == local.fingerprint()
    assert all_rows(remote) == all_rows(local)


def test_an_s3_object_that_is_not_parquet_is_the_local_data_error(
    s3_server: tuple[str, Any], tmp_path: Path
) -> None:
    """A `.parquet` object that is not Parquet was refused in words of its own ('the file does
    not end in the Parquet magic bytes') where the local copy gave pyarrow's."""
    endpoint, _ = s3_server
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "part-0.parquet").write_bytes(b"not parquet at all\n" * 50)
    upload(endpoint, tmp_path / "local", "bucket", "odd")
    errors = []
    for where, options in (
        ("s3://bucket/odd/part-0.parquet", s3_storage(endpoint)),
        (str(tmp_path / "local" / "part-0.parquet"), None),
    ):
        with pytest.raises(DataError) as raised:
            Dataset.from_path("odd", where, storage_options=options)
        errors.append(str(raised.value).replace(where, "SHARD"))
    assert errors[0] == errors[1]
    assert "shard 'SHARD': not a readable Parquet file: Parquet magic bytes not found" in errors[0]


def test_a_cache_smaller_than_the_dataset_never_exceeds_its_limit(
    s3_server: tuple[str, Any], tmp_path: Path
) -> None:
    endpoint, _ = s3_server
    write_corpus(tmp_path / "local", "jsonl", shards=6)
    upload(endpoint, tmp_path / "local", "bucket", "small")
    shard_size = max(f.stat().st_size for f in (tmp_path / "local").iterdir())
    limit = 2 * shard_size + 10
    cache = tmp_path / "cache"
    options = {"cache": {"dir": str(cache), "max_bytes": limit}}
    remote = Dataset.from_path(
        "c", "s3://bucket/small", storage_options=s3_storage(endpoint), io_options=options
    )
    local = Dataset.from_path("c", tmp_path / "local", index_cache_dir=str(tmp_path / "idx"))
    assert _cache_bytes(cache) <= limit
    for number, shard in enumerate(remote.shards):
        rows = list(range(shard.num_rows))
        assert remote.read_rows(number, rows) == local.read_rows(number, rows)
        assert _cache_bytes(cache) <= limit


def test_a_pipeline_over_s3_gives_the_batches_of_the_local_copy_and_prefetches(
    s3_server: tuple[str, Any], tmp_path: Path, tokenizer: Any
) -> None:
    from tests.helpers import keys
    from zephon_torch import Pipeline
    from zephon_torch.work import StaticMixtureWorkSource, TokenEstimation

    endpoint, _ = s3_server
    write_corpus(tmp_path / "local", "jsonl", shards=6, rows=30)
    upload(endpoint, tmp_path / "local", "bucket", "corpus")
    cache = tmp_path / "cache"
    remote = Dataset.from_path(
        "c",
        "s3://bucket/corpus/",
        storage_options=s3_storage(endpoint),
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


def _open_both(endpoint: str, tmp_path: Path, kind: str) -> tuple[Dataset, Dataset]:
    local = write_format(tmp_path / kind, kind)
    upload(endpoint, local, "bucket", kind)
    options = {"cache": {"dir": str(tmp_path / "cache")}}
    remote = Dataset.from_path(
        kind, f"s3://bucket/{kind}", storage_options=s3_storage(endpoint), io_options=options
    )
    return remote, Dataset.from_path(kind, local)


@pytest.mark.parametrize("kind", ["mds", "mds-zstd", "litdata", "npy"])
def test_mds_litdata_and_npy_on_s3_read_the_same_rows_as_the_local_copy(
    s3_server: tuple[str, Any], tmp_path: Path, kind: str
) -> None:
    endpoint, _ = s3_server
    remote, local = _open_both(endpoint, tmp_path, kind)
    assert remote.format == local.format == kind.split("-", maxsplit=1)[0]
    assert len(remote.shards) > 1
    assert all(shard.path.startswith(f"s3://bucket/{kind}/") for shard in remote.shards)
    assert remote.fingerprint() == local.fingerprint()
    assert plain_rows(remote) == plain_rows(local)
    copy = pickle.loads(pickle.dumps(remote))  # as a DataLoader worker gets it
    assert [plain(row) for row in copy.read_rows(1, [2, 0])] == [
        plain(row) for row in local.read_rows(1, [2, 0])
    ]


def test_a_pipeline_over_npy_tokens_on_s3_gives_the_batches_of_the_local_copy(
    s3_server: tuple[str, Any], tmp_path: Path
) -> None:
    from tests.helpers import keys
    from zephon_torch import Pipeline
    from zephon_torch.work import StaticMixtureWorkSource, TokenEstimation

    endpoint, _ = s3_server
    remote, local = _open_both(endpoint, tmp_path, "npy")

    def build(dataset: Dataset) -> Pipeline:
        source = StaticMixtureWorkSource(
            [dataset], seed=3, token_estimation=TokenEstimation(), shuffle_window_shards=2
        )
        pipeline = Pipeline(source).options(canonical_replicas=2)
        return pipeline.pretokenized("input_ids", eos_token_id=0).pack_flat(16).batch(2)

    over_s3 = build(remote)
    assert keys(over_s3) == keys(build(local))
    assert over_s3.stats()["cache"]["misses"] == 5  # three token files, two offsets files


def test_an_index_listing_a_shard_the_bucket_lacks_is_a_data_error_naming_it(
    s3_server: tuple[str, Any], tmp_path: Path
) -> None:
    endpoint, _ = s3_server
    local = write_format(tmp_path / "mds", "mds")
    upload(endpoint, local, "bucket", "mds")
    client(endpoint).delete_object(Bucket="bucket", Key="mds/shard.00001.mds")
    with pytest.raises(DataError, match=r"missing, though index\.json lists it") as caught:
        Dataset.from_path(
            "gone",
            "s3://bucket/mds/index.json",
            storage_options=s3_storage(endpoint),
            io_options={"cache": {"dir": str(tmp_path / "cache")}},
        )
    assert caught.value.shard == "s3://bucket/mds/shard.00001.mds"


def test_prefetching_an_npy_shard_caches_its_offsets_file_too(
    s3_server: tuple[str, Any], tmp_path: Path
) -> None:
    endpoint, _ = s3_server
    remote, local = _open_both(endpoint, tmp_path, "npy")
    assert remote.cache_counters() == {"hits": 0, "misses": 0, "bytes_downloaded": 0}
    remote.prefetch([1])
    deadline = time.monotonic() + 20
    while remote.cache_counters()["misses"] < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    cached = sorted(p.name.split("-", 1)[1] for p in (tmp_path / "cache").glob("*-*.npy"))
    assert cached == ["1.npy", "1.offsets.npy"]
    rows = range(remote.shards[1].num_rows)
    assert [plain(row) for row in remote.read_rows(1, rows)] == [
        plain(row) for row in local.read_rows(1, rows)
    ]
    assert remote.cache_counters()["misses"] == 2  # the read found both files cached
    assert remote.cache_counters()["hits"] == 2


@pytest.mark.parametrize("kind", ["mds", "npy"])
def test_a_truncated_shard_on_s3_is_a_data_error_naming_its_url(
    s3_server: tuple[str, Any], tmp_path: Path, kind: str
) -> None:
    endpoint, _ = s3_server
    local = write_format(tmp_path / kind, kind)
    name = "shard.00001.mds" if kind == "mds" else "1.npy"
    data = (local / name).read_bytes()
    (local / name).write_bytes(data[: len(data) // 2])
    upload(endpoint, local, "bucket", kind)
    options = {"cache": {"dir": str(tmp_path / "cache")}}
    if kind == "npy":  # rows counted from its header, checked against its size at the open
        with pytest.raises(DataError, match=r"'1\.npy' is shorter than its \.npy header") as caught:
            Dataset.from_path(
                kind,
                f"s3://bucket/{kind}/",
                storage_options=s3_storage(endpoint),
                io_options=options,
            )
        assert caught.value.shard == f"s3://bucket/{kind}/{name}"
        return
    remote = Dataset.from_path(
        kind, f"s3://bucket/{kind}/", storage_options=s3_storage(endpoint), io_options=options
    )
    assert remote.read_rows(0, [0])  # the other shards read
    with pytest.raises(DataError, match=r"truncated|not a readable") as caught:
        remote.read_rows(1, [0])
    assert caught.value.shard == f"s3://bucket/{kind}/{name}"
    assert "cache" not in str(caught.value)


def test_the_first_open_of_compressed_jsonl_counts_within_a_small_cache(
    s3_server: tuple[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The open counted 16 shards at once, each holding its compressed download while it
    waited for room for its decompressed copy: together past `max_bytes` (3.5x in a review's
    run), they stalled for 5 s and fell back to memory. It now counts as many at once as fit."""
    import gzip
    import logging
    import random

    endpoint, _ = s3_server
    words = [f"w{n}" for n in range(3000)]
    rng = random.Random(0)
    local = tmp_path / "local"
    local.mkdir()
    for shard in range(12):
        lines = "".join(
            json.dumps({"text": " ".join(rng.choices(words, k=120)), "id": shard * 100 + i}) + "\n"
            for i in range(100)
        )
        (local / f"part-{shard:03d}.jsonl.gz").write_bytes(gzip.compress(lines.encode()))
    upload(endpoint, local, "bucket", "gz")
    largest = max(p.stat().st_size for p in local.iterdir())
    cache = {"dir": str(tmp_path / "cache"), "max_bytes": 12 * largest, "prefetch_bytes": 0}
    with caplog.at_level(logging.WARNING, logger="zephon_torch"):
        remote = Dataset.from_path(
            "gz",
            "s3://bucket/gz/",
            storage_options=s3_storage(endpoint),
            io_options={"cache": cache},
        )
    assert [
        r.getMessage() for r in caplog.records if "holding it in memory" in r.getMessage()
    ] == []
    assert remote.num_rows == 1200
    assert _cache_bytes(tmp_path / "cache") <= 12 * largest


def test_shards_held_open_are_sized_to_the_disk_where_it_is_smaller_than_max_bytes(
    s3_server: tuple[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader kept up to 16 shards open by the default 64 GiB `max_bytes`: on a small disk
    those shards, evicted but held open, filled it, and a run with nothing else in use failed
    with CacheDiskFullError (a review's 2 MiB tmpfs, at shard 13)."""
    import shutil

    from zephon_torch.io import _remote_sizing

    endpoint, _ = s3_server
    write_corpus(tmp_path / "local", "jsonl", shards=4)
    upload(endpoint, tmp_path / "local", "bucket", "open")
    largest = max(p.stat().st_size for p in (tmp_path / "local").iterdir())
    cache = {"dir": str(tmp_path / "cache" / "not" / "made"), "max_bytes": 64 << 30}
    remote = Dataset.from_path(
        "d", "s3://bucket/open/", storage_options=s3_storage(endpoint), io_options={"cache": cache}
    )
    reader = remote._reader
    assert _remote_sizing.disk_size(str(tmp_path / "no" / "such")) == (
        shutil.disk_usage(tmp_path).total
    )
    monkeypatch.setattr(_remote_sizing, "disk_size", lambda folder: 64 << 30)
    assert _remote_sizing.max_open(reader.objects, reader.options.cache) == 16
    monkeypatch.setattr(_remote_sizing, "disk_size", lambda folder: 8 * 5 * largest)
    assert _remote_sizing.max_open(reader.objects, reader.options.cache) == 5
    monkeypatch.setattr(_remote_sizing, "disk_size", lambda folder: largest)
    assert _remote_sizing.max_open(reader.objects, reader.options.cache) == 2
