"""Compressed JSONL shards are decompressed once per node into the shard cache and mapped from
there: not held in each process's memory, bounded by the cache's `max_bytes`, made once however
many processes read them."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest

from tests.unit.io.conftest import WriteJsonl
from zephon_torch import Pipeline
from zephon_torch.errors import ConfigError
from zephon_torch.io import Dataset
from zephon_torch.io import jsonl as jsonl_module
from zephon_torch.io._shard_cache import ShardCache
from zephon_torch.io.jsonl import JsonlReader
from zephon_torch.work import StaticMixtureWorkSource


def _rows(count: int, start: int = 0) -> list[dict[str, Any]]:
    return [{"id": start + i, "text": f"row {start + i} " + "x" * (i % 50)} for i in range(count)]


def _cached_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))


def _count_makes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    made: list[str] = []
    original = jsonl_module.decompress_to

    def counted(path: str, compression: Any, target: str) -> None:
        made.append(path)
        original(path, compression, target)

    monkeypatch.setattr(jsonl_module, "decompress_to", counted)
    return made


@pytest.mark.parametrize("compression", ["gzip", "zstd"])
def test_a_compressed_shard_is_read_from_a_mapped_file_in_the_cache(
    tmp_path: Path, write_jsonl: WriteJsonl, compression: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = _rows(500)
    write_jsonl(tmp_path / "data" / "a.jsonl.gz", rows, compression=compression)
    cache = tmp_path / "cache"
    made = _count_makes(monkeypatch)
    options = {"cache": {"dir": str(cache)}}
    dataset = Dataset.from_path("d", tmp_path / "data", io_options=options)
    assert dataset.read_rows(0, [499, 0, 250]) == [rows[499], rows[0], rows[250]]
    [file] = _cached_files(cache)
    expected = "".join(f'{{"id": {r["id"]}, "text": "{r["text"]}"}}\n' for r in rows).encode()
    assert file.read_bytes() == expected
    reader = dataset._reader
    assert isinstance(reader, JsonlReader)
    held = [buffer for buffer, _ in reader._decompressed._state.items.values()]
    assert held and all(type(buffer) is not bytes for buffer in held)  # maps, not copies
    again = Dataset.from_path("d", tmp_path / "data", io_options=options)  # as another process
    assert again.read_rows(0, range(500)) == rows
    assert made == [str(tmp_path / "data" / "a.jsonl.gz")]  # decompressed once


def _read_all(path: str, cache: str, out: Any) -> None:
    made = _count_makes_in_child()
    dataset = Dataset.from_path("d", path, io_options={"cache": {"dir": cache}})
    rows = [row for shard in range(3) for row in dataset.read_rows(shard, range(200))]
    out.put((len(made), rows))


def _count_makes_in_child() -> list[str]:
    made: list[str] = []
    original = jsonl_module.decompress_to

    def counted(path: str, compression: Any, target: str) -> None:
        made.append(path)
        original(path, compression, target)

    jsonl_module.decompress_to = counted  # type: ignore[assignment]  # this child only
    return made


def test_processes_sharing_the_cache_decompress_each_shard_once(
    tmp_path: Path, write_jsonl: WriteJsonl
) -> None:
    tables = [_rows(200, start=200 * i) for i in range(3)]
    for number, table in enumerate(tables):
        write_jsonl(tmp_path / "data" / f"{number}.jsonl.gz", table, compression="gzip")
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    children = [
        context.Process(
            target=_read_all, args=(str(tmp_path / "data"), str(tmp_path / "cache"), out)
        )
        for _ in range(4)
    ]
    for child in children:
        child.start()
    results = [out.get(timeout=60) for _ in children]
    for child in children:
        child.join(timeout=60)
        assert child.exitcode == 0
    assert all(rows == [row for table in tables for row in table] for _, rows in results)
    assert sum(made for made, _ in results) == 3  # each shard made by one of the four
    assert len(_cached_files(tmp_path / "cache")) == 3


def test_the_cache_stays_within_max_bytes_and_evicted_shards_are_made_again(
    tmp_path: Path, write_jsonl: WriteJsonl, monkeypatch: pytest.MonkeyPatch
) -> None:
    tables = [_rows(300, start=300 * i) for i in range(4)]
    for number, table in enumerate(tables):
        write_jsonl(tmp_path / "data" / f"{number}.jsonl.zst", table, compression="zstd")
    size = max(len("".join(json.dumps(r) + "\n" for r in table)) for table in tables)
    limit = 2 * size + size // 2  # two decompressed shards fit, three do not
    cache = tmp_path / "cache"
    made = _count_makes(monkeypatch)
    dataset = Dataset.from_path(
        "d", tmp_path / "data", io_options={"cache": {"dir": str(cache), "max_bytes": limit}}
    )
    reader = dataset._reader
    assert isinstance(reader, JsonlReader)
    assert len(made) == 4  # opening counts the rows of each
    for round_ in range(2):
        made.clear()
        for number, table in enumerate(tables):
            reader._decompressed = type(reader._decompressed)(1)  # forget the maps we hold
            assert dataset.read_rows(number, [299, 3]) == [table[299], table[3]]
            assert ShardCache(str(cache), limit).used_bytes() <= limit
        if round_:  # in order, each shard was evicted by the two read after it
            assert len(made) == 4


def test_a_shard_larger_than_the_cache_is_a_config_error_naming_it(
    tmp_path: Path, write_jsonl: WriteJsonl
) -> None:
    path = write_jsonl(tmp_path / "a.jsonl.gz", _rows(300), compression="gzip")
    options = {"cache": {"dir": str(tmp_path / "c"), "max_bytes": 1000}}
    with pytest.raises(ConfigError, match=r"max_bytes` is 1000.*a\.jsonl\.gz \(decompressed\)"):
        Dataset.from_path("d", path, io_options=options)  # which counts its rows


def test_a_rewritten_shard_is_decompressed_again(tmp_path: Path, write_jsonl: WriteJsonl) -> None:
    path = write_jsonl(tmp_path / "a.jsonl.gz", _rows(20), compression="gzip")
    assert Dataset.from_path("d", path).read_rows(0, [5]) == [_rows(20)[5]]
    write_jsonl(path, _rows(30, start=100), compression="gzip")
    os.utime(path, ns=(1, 10**18))  # a new version, whatever the clock's resolution
    assert Dataset.from_path("d", path).read_rows(0, [5, 29]) == [
        _rows(30, 100)[i] for i in (5, 29)
    ]


def test_pipeline_io_options_choose_where_a_local_dataset_decompresses(
    tmp_path: Path, write_jsonl: WriteJsonl, tokenizer: Any
) -> None:
    write_jsonl(tmp_path / "data" / "a.jsonl.gz", _rows(40), compression="gzip")
    dataset = Dataset.from_path("d", tmp_path / "data", columns=["text"])
    source = StaticMixtureWorkSource([dataset], seed=0, exhaustion="stop")
    chosen = tmp_path / "chosen"
    pipeline = (
        Pipeline(source)
        .options(io_options={"cache": {"dir": str(chosen)}})
        .tokenize(tokenizer=tokenizer)
        .pack_flat(64, "wrap")
        .batch(2)
    )
    assert sum(batch.num_tokens for batch in pipeline) > 0
    assert len(_cached_files(chosen)) == 1
