"""`hf://` with the lowest huggingface_hub the `hf` extra takes, 0.34 (transformers 4.x requires
one before 1.0), installed by `make install` into `.hub-lowest` beside the suite's newer one and
put first on PYTHONPATH in the reading interpreter: online reads give what the suite's client
gives; the hub cache, whose commits it keeps no listing of, is refused, naming the version."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hf_repos import (
    download_patterns,
    plain_hub,
    read_online,
    run_offline,
    script_repo,
    write_split,
)
from tests.hub_server import Hub, serve

pytest.importorskip("huggingface_hub")

LOWEST = Path(__file__).resolve().parents[2] / ".hub-lowest"
LOWEST_VERSION = "0.34.0"


def lowest() -> dict[str, str]:
    """The environment that makes a fresh interpreter import the lowest huggingface_hub (and
    checks it does)."""
    if not (LOWEST / "huggingface_hub").is_dir():
        pytest.fail(f"{LOWEST} holds no huggingface_hub: `make install` (or `make test`) puts it")
    env = {"PYTHONPATH": os.pathsep.join([str(LOWEST), os.environ.get("PYTHONPATH", "")])}
    code = "import huggingface_hub as h; print(h.__version__, hasattr(h, 'get_cached_repo_tree'))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    assert done.stdout.split() == [LOWEST_VERSION, "False"]
    return env


def test_the_lowest_hub_client_reads_a_split_online_as_the_newest_does(tmp_path: Path) -> None:
    hub = plain_hub(tmp_path / "repo")
    with serve(hub) as endpoint:
        old = read_online("hf://org/plain/train", endpoint, tmp_path / "old", **lowest())
        new = read_online("hf://org/plain/train", endpoint, tmp_path / "new")
    texts = [f"train {i}" for i in range(300)] + [f"train {i}" for i in range(200)]
    assert [row["text"] for row in old["rows"]] == texts
    assert (old["format"], old["rows"], old["shards"]) == (
        new["format"],
        new["rows"],
        new["shards"],
    )


def test_the_lowest_hub_client_reads_the_converted_parquet_online(tmp_path: Path) -> None:
    """The auto-converted layout is another revision (`refs/convert/parquet`), asked for by
    name: the old client's revision handling reads it too."""
    hub = Hub()
    converted = tmp_path / "converted"
    write_split(converted / "wiki" / "train" / "0000.parquet", "wiki-train", 3)
    hub.add("org/conv", "main", script_repo(tmp_path / "main"))
    hub.add("org/conv", "refs/convert/parquet", converted)
    with serve(hub) as endpoint:
        train = read_online("hf://org/conv/wiki/train", endpoint, tmp_path, **lowest())
    assert [row["text"] for row in train["rows"]] == [f"wiki-train {i}" for i in range(3)]
    sha = Hub.sha("org/conv", "refs/convert/parquet", converted)
    assert train["shards"] == [f"hf://datasets/org/conv@{sha}/wiki/train/0000.parquet"]


def test_with_the_lowest_hub_client_the_hub_cache_is_refused_naming_its_version(
    tmp_path: Path,
) -> None:
    """Its cache keeps no listing of a commit: a split cached in part (here one shard of two,
    downloaded with its card) read as the whole split, silently, before this was refused; the
    newest client names what is missing."""
    hub = plain_hub(tmp_path / "repo")
    cache = tmp_path / "hub"
    with serve(hub) as endpoint:
        download_patterns(endpoint, cache, "org/plain", ["README.md", "data/train-00000-*"])
    old = run_offline(cache, "hf://org/plain/train", tmp_path, **lowest())
    assert old.returncode != 0
    assert (
        "reading hf:// from the local hub cache (offline, or with the hub not answering) needs "
        "huggingface_hub 1.23 or newer" in old.stderr
    )
    assert f"huggingface_hub {LOWEST_VERSION} is installed" in old.stderr
    new = run_offline(cache, "hf://org/plain/train", tmp_path)
    assert new.returncode != 0
    assert "the hub cache holds only part of 'hf://org/plain/train'" in new.stderr
