"""`hf://` offline from a hub cache that holds part of what a split needs: a commit lacking a
numbered shard (read as online where another commit holds it whole), a card cached without its
split, blobs the cache lost under their links: each is named, none is read past."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.hf_repos import (
    cache_snapshot,
    download_patterns,
    read_offline,
    read_online,
    run_offline,
    write_split,
)
from tests.hub_server import Hub, serve
from zephon_torch.io import Dataset

pytest.importorskip("huggingface_hub")


def test_offline_a_commit_lacking_a_numbered_shard_reads_as_online_when_cached_whole(
    tmp_path: Path,
) -> None:
    """A commit whose split lacks one of its numbered shards (`-00001-of-00003` never uploaded,
    or deleted) read online and by a local path, but offline its whole download was refused for
    a shard 'missing' from the cache, advising a download that brings nothing more: the
    commit's cached listing, which says what the split holds, now decides; a part of it is
    still refused."""
    repo = tmp_path / "repo"
    for shard in (0, 2):
        write_split(repo / "data" / f"train-0000{shard}-of-00003.parquet", f"shard-{shard}", 2)
    (repo / "README.md").write_text("# card")
    local = Dataset.from_path("hf", str(repo / "data"), index_cache_dir=str(tmp_path / "i"))
    expected = [row["text"] for row in local.read_rows(0, [0, 1]) + local.read_rows(1, [0, 1])]
    hub = Hub()
    hub.add("org/gap", "main", repo)
    with serve(hub) as endpoint:
        online = read_online("hf://org/gap/train", endpoint, tmp_path)
        download_patterns(endpoint, tmp_path / "whole", "org/gap", ["*"])
        download_patterns(endpoint, tmp_path / "part", "org/gap", ["README.md", "data/*00000*"])
    offline = read_offline(tmp_path / "whole", "hf://org/gap/train", tmp_path)
    assert [row["text"] for row in online["rows"]] == expected
    assert [row["text"] for row in offline["rows"]] == expected
    part = run_offline(tmp_path / "part", "hf://org/gap/train", tmp_path)
    assert "1 of its 2 files are missing (data/train-00002-of-00003.parquet)" in part.stderr


def test_offline_a_card_cached_without_its_split_is_not_read_from_the_converted_parquet(
    tmp_path: Path,
) -> None:
    """A cache holding main's card alone and the auto-converted Parquet read the converted
    split, another commit (a prefix, for a large split), where online read the uploaded
    files: main's cached listing says the split has files there, and the cache lacks them."""
    main = tmp_path / "main"
    write_split(main / "data" / "train-00000-of-00001.parquet", "uploaded", 3)
    (main / "README.md").write_text("# card")
    converted = tmp_path / "converted"
    write_split(converted / "default" / "train" / "0000.parquet", "converted", 3)
    hub = Hub()
    hub.add("org/both", "main", main)
    hub.add("org/both", "refs/convert/parquet", converted)
    with serve(hub) as endpoint:
        online = read_online("hf://org/both/train", endpoint, tmp_path)
        assert [row["text"] for row in online["rows"]] == [f"uploaded {i}" for i in range(3)]
        download_patterns(endpoint, tmp_path / "card", "org/both", ["README.md"])
        download_patterns(
            endpoint, tmp_path / "card", "org/both", ["default/*"], "refs/convert/parquet"
        )
    done = run_offline(tmp_path / "card", "hf://org/both/train", tmp_path)
    assert done.returncode != 0
    assert "the hub cache holds only part of 'hf://org/both/train': 1 of its 1 files " in (
        done.stderr
    )
    assert "(data/train-00000-of-00001.parquet)" in done.stderr
    # the converted split, asked for by name, is read
    pinned = read_offline(
        tmp_path / "card", "hf://org/both@refs%2Fconvert%2Fparquet/train", tmp_path
    )
    assert [row["text"] for row in pinned["rows"]] == [f"converted {i}" for i in range(3)]


def test_offline_a_split_file_whose_blob_the_cache_lost_is_named_as_missing(
    tmp_path: Path,
) -> None:
    """A snapshot's link to a blob the hub cache no longer holds (deleted by hand, a cache
    copied without its blobs/) was read as a damaged shard: a JSONL one's error asked whether
    the file changed after the open, a Parquet one's called it unreadable."""
    repo = tmp_path / "repo"
    write_split(repo / "data" / "train-00000-of-00002.parquet", "a", 2)
    write_split(repo / "data" / "train-00001-of-00002.parquet", "b", 2)
    (repo / "data" / "test.jsonl").write_text('{"text": "x"}\n')
    (repo / "README.md").write_text("# card")
    hub = Hub()
    hub.add("org/lost", "main", repo)
    with serve(hub) as endpoint:
        download_patterns(endpoint, tmp_path / "hub", "org/lost", ["*"])
    snapshot = next((tmp_path / "hub" / "datasets--org--lost" / "snapshots").iterdir())
    for lost in ("data/train-00001-of-00002.parquet", "data/test.jsonl"):
        os.remove(os.path.realpath(snapshot / lost))
    for url, lost in (
        ("hf://org/lost/train", "data/train-00001-of-00002.parquet"),
        ("hf://org/lost/test", "data/test.jsonl"),
    ):
        done = run_offline(tmp_path / "hub", url, tmp_path)
        assert done.returncode != 0
        assert (
            f"ConfigError: the hub cache holds only part of {url!r}: the links of 1 of its "
            f"files lead to no file in its blobs/ ({lost})"
        ) in done.stderr


def test_offline_a_card_whose_blob_the_cache_lost_is_named_not_read_past(tmp_path: Path) -> None:
    """Where the hub cache keeps no listing of the commit (files fetched by `hf_hub_download`,
    as most clients do), a card's link to a lost blob left its `configs:` unread: the split
    was found by file names, `data/train.jsonl` read in place of the card's `custom/*.jsonl`."""
    cache = tmp_path / "hub"
    snapshot = cache_snapshot(cache, "org/card", "main", "a" * 40)
    write_split(snapshot / "custom" / "x.parquet", "card", 3)
    write_split(snapshot / "data" / "train.parquet", "by name", 2)
    card = (
        "---\nconfigs:\n- config_name: default\n  data_files:\n    train: custom/*.parquet\n---\n"
    )
    blob = cache / "datasets--org--card" / "blobs" / "1f2e"
    blob.parent.mkdir()
    blob.write_text(card)
    (snapshot / "README.md").symlink_to(os.path.relpath(blob, snapshot))
    read = read_offline(cache, "hf://org/card/train", tmp_path)
    assert [row["text"] for row in read["rows"]] == ["card 0", "card 1", "card 2"]
    blob.unlink()
    done = run_offline(cache, "hf://org/card/train", tmp_path)
    assert done.returncode != 0
    assert (
        "ConfigError: the hub cache holds only part of 'hf://org/card/train': the link of the "
        "dataset card README.md of org/card at commit aaaaaaaaaaaa"
    ) in done.stderr
