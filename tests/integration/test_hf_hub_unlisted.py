"""`hf://` offline from a hub cache that keeps no listing of the commit: its files downloaded one
by one (`hf_hub_download`) rather than by a snapshot download. What the listing would check (a
split cached whole, the card that picks its files) is then told in a warning where nothing
else vouches for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hf_repos import download_files, download_patterns, read_offline, write_split
from tests.hub_server import Hub, serve

pytest.importorskip("huggingface_hub")

NO_LISTING = "the hub cache keeps no listing of commit"


def loose_hub(folder: Path) -> Hub:
    """org/loose at main: a card and a train split of two files without shard numbers."""
    write_split(folder / "data" / "train" / "part-a.parquet", "a", 2)
    write_split(folder / "data" / "train" / "part-b.parquet", "b", 3)
    (folder / "README.md").write_text("# card")
    hub = Hub()
    hub.add("org/loose", "main", folder)
    return hub


def test_unnumbered_files_cached_one_by_one_read_with_a_warning_that_part_may_be_missing(
    tmp_path: Path,
) -> None:
    """Half of the split cached file by file read as the whole split, silently: nothing tells
    `part-a` alone from the split without the commit's listing."""
    hub = loose_hub(tmp_path / "repo")
    with serve(hub) as endpoint:
        download_files(
            endpoint, tmp_path / "part", "org/loose", ["README.md", "data/train/part-a.parquet"]
        )
        download_patterns(endpoint, tmp_path / "snapshot", "org/loose", ["*"])
    part = read_offline(tmp_path / "part", "hf://org/loose/train", tmp_path)
    assert [row["text"] for row in part["rows"]] == ["a 0", "a 1"]
    assert NO_LISTING in part["stderr"]
    assert "that its 1 cached file(s) are all of the split cannot be checked" in part["stderr"]
    assert "e.g. 'data/train/part-a.parquet'" in part["stderr"]
    assert "no dataset card is cached" not in part["stderr"]  # the card is there
    assert "hf download org/loose --repo-type dataset" in part["stderr"]
    whole = read_offline(tmp_path / "snapshot", "hf://org/loose/train", tmp_path)
    assert [row["text"] for row in whole["rows"]] == ["a 0", "a 1", "b 0", "b 1", "b 2"]
    assert NO_LISTING not in whole["stderr"]


def test_numbered_files_cached_one_by_one_without_the_card_warn_of_the_card_alone(
    tmp_path: Path,
) -> None:
    """Numbered shards vouch for a whole split; a card the cache lacks may still choose other
    files for it than the names do."""
    folder = tmp_path / "repo"
    write_split(folder / "data" / "train-00000-of-00002.parquet", "train", 2)
    write_split(folder / "data" / "train-00001-of-00002.parquet", "train", 1)
    (folder / "README.md").write_text("# card")
    hub = Hub()
    hub.add("org/numbered", "main", folder)
    names = [f"data/train-0000{n}-of-00002.parquet" for n in range(2)]
    with serve(hub) as endpoint:
        download_files(endpoint, tmp_path / "cardless", "org/numbered", names)
        download_files(endpoint, tmp_path / "carded", "org/numbered", ["README.md", *names])
    cardless = read_offline(tmp_path / "cardless", "hf://org/numbered/train", tmp_path)
    assert len(cardless["rows"]) == 3
    assert NO_LISTING in cardless["stderr"]
    assert "no dataset card is cached" in cardless["stderr"]
    assert "cannot be checked" not in cardless["stderr"]  # the numbers vouch for the files
    carded = read_offline(tmp_path / "carded", "hf://org/numbered/train", tmp_path)
    assert len(carded["rows"]) == 3
    assert NO_LISTING not in carded["stderr"]
