"""`hf://` datasets read offline from a pre-populated hub cache: plain data files and the hub's
auto-converted Parquet (`refs/convert/parquet`). huggingface_hub reads HF_HUB_OFFLINE at import,
so each read runs in a fresh interpreter with the environment set."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon_torch.io._hf import parse_hf_url, split_files

pytest.importorskip("huggingface_hub")

_READ = """
import json, sys
from zephon_torch.io import Dataset
dataset = Dataset.from_path("hf", sys.argv[1])
rows = [r for n, s in enumerate(dataset.shards) for r in dataset.read_rows(n, range(s.num_rows))]
print(json.dumps({"format": dataset.format, "rows": rows}))
"""


def _snapshot(cache: Path, repo: str, ref: str, sha: str) -> Path:
    folder = cache / f"datasets--{repo.replace('/', '--')}"
    ref_file = folder / "refs" / ref
    ref_file.parent.mkdir(parents=True, exist_ok=True)
    ref_file.write_text(sha)
    snapshot = folder / "snapshots" / sha
    snapshot.mkdir(parents=True, exist_ok=True)
    return snapshot


def _parquet(path: Path, split: str, count: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"text": [f"{split} {i}" for i in range(count)]}), path)


def _read_offline(cache: Path, url: str, tmp_path: Path) -> dict[str, Any]:
    env = {
        **os.environ,
        "HF_HUB_CACHE": str(cache),
        "HF_HUB_OFFLINE": "1",
        "ZEPHON_TORCH_CACHE": str(tmp_path / "zt"),
    }
    done = subprocess.run(
        [sys.executable, "-c", _READ, url],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_plain_data_files_of_a_split_are_read_from_the_offline_cache(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    snapshot = _snapshot(cache, "org/plain", "main", "a" * 40)
    _parquet(snapshot / "data" / "train-00000-of-00002.parquet", "train", 3)
    _parquet(snapshot / "data" / "train-00001-of-00002.parquet", "train", 2)
    _parquet(snapshot / "data" / "test-00000-of-00001.parquet", "test", 4)
    (snapshot / "README.md").write_text("# card")
    result = _read_offline(cache, "hf://org/plain/train", tmp_path)
    assert result["format"] == "parquet"
    assert [row["text"] for row in result["rows"]] == [
        "train 0",
        "train 1",
        "train 2",
        "train 0",
        "train 1",
    ]


def test_the_auto_converted_parquet_layout_is_read_from_the_offline_cache(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    main = _snapshot(cache, "org/conv", "main", "b" * 40)
    (main / "README.md").write_text("# a dataset with a loading script")
    (main / "conv.py").write_text("# builder")
    converted = _snapshot(cache, "org/conv", "refs/convert/parquet", "c" * 40)
    _parquet(converted / "wiki" / "train" / "0000.parquet", "wiki-train", 3)
    _parquet(converted / "wiki" / "partial-validation" / "0000.parquet", "wiki-val", 2)
    _parquet(converted / "other" / "train" / "0000.parquet", "other", 1)
    train = _read_offline(cache, "hf://org/conv/wiki/train", tmp_path)
    assert [row["text"] for row in train["rows"]] == [f"wiki-train {i}" for i in range(3)]
    validation = _read_offline(cache, "hf://org/conv/wiki/validation", tmp_path)
    assert [row["text"] for row in validation["rows"]] == ["wiki-val 0", "wiki-val 1"]


def test_hf_urls_and_split_files_are_parsed_without_the_hub() -> None:
    assert parse_hf_url("hf://Salesforce/wikitext/wikitext-2-raw-v1/train") == (
        "Salesforce/wikitext",
        "wikitext-2-raw-v1",
        "train",
    )
    assert parse_hf_url("hf://org/name/test") == ("org/name", None, "test")
    files = ["data/train-0.parquet", "data/training.txt", "test.jsonl", "c/train/x.parquet"]
    assert split_files(files, None, "train") == ["c/train/x.parquet", "data/train-0.parquet"]
    assert split_files(files, "c", "train") == ["c/train/x.parquet"]
