"""`hf://` datasets: read offline from a pre-populated hub cache, and online from a stand-in for
the hub on loopback (`tests/hub_server.py`), shard by shard through the shard cache: plain data
files and the hub's auto-converted Parquet (`refs/convert/parquet`). huggingface_hub reads
HF_HUB_OFFLINE and HF_ENDPOINT at import, so each read runs in a fresh interpreter with the
environment set."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.hub_server import Hub, serve
from tests.unit.io.test_io_formats_writers import write_mds
from zephon_torch.errors import ConfigError
from zephon_torch.io import Dataset
from zephon_torch.io._hf_splits import check_complete, parse_hf_url, pinned_revision

pytest.importorskip("huggingface_hub")

_READ = """
import json, sys
from zephon_torch.io import Dataset
dataset = Dataset.from_path("hf", sys.argv[1])
rows = [r for n, s in enumerate(dataset.shards) for r in dataset.read_rows(n, range(s.num_rows))]
print(json.dumps({"format": dataset.format, "rows": rows, "fingerprint": dataset.fingerprint()}))
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
    """The dataset's format and rows, and what the read printed to stderr."""
    done = _run_offline(cache, url, tmp_path)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return {**result, "stderr": done.stderr}


def _run_offline(cache: Path, url: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "HF_HUB_CACHE": str(cache),
        "HF_HUB_OFFLINE": "1",
        "ZEPHON_TORCH_CACHE": str(tmp_path / "zt"),
    }
    return subprocess.run(
        [sys.executable, "-c", _READ, url],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


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


def test_offline_a_split_not_there_names_the_splits_there_and_no_hub_advice(
    tmp_path: Path,
) -> None:
    """It named neither 'train' nor 'test', and passed on huggingface_hub's advice to pass
    `local_files_only=False`, no setting of ours (a fresh-user trial)."""
    cache = tmp_path / "hub"
    snapshot = _snapshot(cache, "org/plain", "main", "a" * 40)
    _parquet(snapshot / "data" / "train-00000-of-00001.parquet", "train", 3)
    _parquet(snapshot / "data" / "test-00000-of-00001.parquet", "test", 4)
    (snapshot / "README.md").write_text("# card")
    done = _run_offline(cache, "hf://org/plain/validation", tmp_path)
    assert done.returncode != 0
    assert "main: no files of split 'validation'; its files' names read as splits " in (done.stderr)
    assert "['test', 'train']" in done.stderr
    assert "refs/convert/parquet: not in the hub cache (LocalEntryNotFoundError)" in done.stderr
    assert "local_files_only" not in done.stderr
    missing = _run_offline(cache, "hf://org/nothere/train", tmp_path)
    assert "main: not in the hub cache" in missing.stderr
    assert "local_files_only" not in missing.stderr


def test_a_split_mixing_formats_is_refused_with_advice_an_hf_path_can_take(
    tmp_path: Path,
) -> None:
    """The refusal advised a glob, which no hf:// path is (a walkthrough's doubt)."""
    cache = tmp_path / "hub"
    snapshot = _snapshot(cache, "org/mixed", "main", "a" * 40)
    _parquet(snapshot / "data" / "train-00000-of-00001.parquet", "train", 3)
    (snapshot / "data" / "train-00000-of-00001.jsonl").write_text('{"text": "x"}\n')
    (snapshot / "README.md").write_text("# card")
    done = _run_offline(cache, "hf://org/mixed/train", tmp_path)
    assert done.returncode != 0
    assert "'hf://org/mixed/train' mixes formats (jsonl: 1 files" in done.stderr
    assert "a config of the dataset card (`configs:`, `data_files`)" in done.stderr
    assert "glob such as" not in done.stderr


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
    assert "partial" not in train["stderr"]
    validation = _read_offline(cache, "hf://org/conv/wiki/validation", tmp_path)
    assert [row["text"] for row in validation["rows"]] == ["wiki-val 0", "wiki-val 1"]
    assert "reads the hub's auto-converted Parquet `partial-validation`" in validation["stderr"]


def test_a_split_the_dataset_card_defines_is_read_from_its_data_files(tmp_path: Path) -> None:
    """Files named by crawl (FineWeb style), the split given by the card's `configs:`: nothing
    on main matched by name, so the hub's partial conversion (a prefix) was read, silently."""
    cache = tmp_path / "hub"
    main = _snapshot(cache, "org/fw", "main", "a" * 40)
    (main / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n"
        "    path: data/*/*\n- config_name: sample\n  data_files: sample/**/*.parquet\n"
        "---\n# a card\n"
    )
    _parquet(main / "data" / "CC-1" / "000_00000.parquet", "crawl-1", 3)
    _parquet(main / "data" / "CC-2" / "000_00000.parquet", "crawl-2", 2)
    _parquet(main / "sample" / "a" / "s.parquet", "sample", 1)
    converted = _snapshot(cache, "org/fw", "refs/convert/parquet", "c" * 40)
    _parquet(converted / "default" / "partial-train" / "0000.parquet", "partial", 1)
    train = _read_offline(cache, "hf://org/fw/train", tmp_path)
    expected = ["crawl-1 0", "crawl-1 1", "crawl-1 2", "crawl-2 0", "crawl-2 1"]
    assert [row["text"] for row in train["rows"]] == expected
    assert _read_offline(cache, "hf://org/fw/default/train", tmp_path)["rows"] == train["rows"]
    sample = _read_offline(cache, "hf://org/fw/sample/train", tmp_path)
    assert [row["text"] for row in sample["rows"]] == ["sample 0"]
    missing = _run_offline(cache, "hf://org/fw/nope/train", tmp_path)
    assert "the dataset card has no config 'nope'" in missing.stderr


def test_a_card_config_s_data_dir_holds_its_splits(tmp_path: Path) -> None:
    """A config with a `data_dir` and no `data_files` finds its splits by name under the
    folder; with `data_files`, they are relative to it. Both fell back to the converted
    Parquet's partial prefix."""
    cache = tmp_path / "hub"
    main = _snapshot(cache, "org/langs", "main", "a" * 40)
    (main / "README.md").write_text(
        "---\nconfigs:\n- config_name: en\n  data_dir: english\n  default: true\n"
        "- config_name: fr\n  data_dir: french/\n  data_files:\n  - split: train\n"
        "    path: 'part-*.parquet'\n---\n# a card\n"
    )
    _parquet(main / "english" / "train-00000-of-00001.parquet", "en-train", 2)
    _parquet(main / "english" / "test-00000-of-00001.parquet", "en-test", 1)
    _parquet(main / "french" / "part-0.parquet", "fr", 3)
    _parquet(main / "train-00000-of-00001.parquet", "root", 1)  # in no config
    converted = _snapshot(cache, "org/langs", "refs/convert/parquet", "c" * 40)
    _parquet(converted / "en" / "partial-train" / "0000.parquet", "partial", 1)
    train = _read_offline(cache, "hf://org/langs/train", tmp_path)
    assert [row["text"] for row in train["rows"]] == ["en-train 0", "en-train 1"]
    assert "partial" not in train["stderr"]
    test = _read_offline(cache, "hf://org/langs/en/test", tmp_path)
    assert [row["text"] for row in test["rows"]] == ["en-test 0"]
    french = _read_offline(cache, "hf://org/langs/fr/train", tmp_path)
    assert [row["text"] for row in french["rows"]] == ["fr 0", "fr 1", "fr 2"]


def test_the_commit_read_is_in_the_fingerprint_and_a_revision_can_be_pinned(
    tmp_path: Path,
) -> None:
    """A branch moved to a commit with the same file names and row counts gave the same
    fingerprint, so a resume went on over other data unnoticed; no revision could be named."""
    cache = tmp_path / "hub"
    old = _snapshot(cache, "org/moved", "main", "a" * 40)
    _parquet(old / "data" / "train-00000-of-00001.parquet", "old", 3)
    new = _snapshot(cache, "org/moved", "main", "b" * 40)  # main points here now
    _parquet(new / "data" / "train-00000-of-00001.parquet", "new", 3)
    latest = _read_offline(cache, "hf://org/moved/train", tmp_path)
    pinned = _read_offline(cache, f"hf://org/moved@{'a' * 40}/train", tmp_path)
    assert [row["text"] for row in latest["rows"]] == ["new 0", "new 1", "new 2"]
    assert [row["text"] for row in pinned["rows"]] == ["old 0", "old 1", "old 2"]
    assert latest["fingerprint"]["revision"] == "b" * 40
    assert pinned["fingerprint"]["revision"] == "a" * 40
    assert parse_hf_url(f"hf://org/moved@{'a' * 40}/c/train") == ("org/moved", "c", "train")
    assert pinned_revision(f"hf://org/moved@{'a' * 40}/train") == "a" * 40
    assert pinned_revision("hf://org/moved/train") is None


def test_offline_a_revision_the_cache_lacks_is_named_with_what_it_holds(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    _plain_repo(_snapshot(cache, "org/plain", "main", "a" * 40))
    _snapshot(cache, "org/plain", "refs/convert/parquet", "b" * 40)
    (cache / "datasets--org--plain" / "snapshots" / ("c" * 40)).mkdir()
    (cache / "datasets--org--plain" / "refs" / "dev").write_text("d" * 40)  # files never came
    lacking = _run_offline(cache, "hf://org/plain@v9/train", tmp_path)
    absent = _run_offline(cache, "hf://org/other@v9/train", tmp_path)
    assert (
        "ConfigError: 'hf://org/plain@v9/train': the hub cache holds no revision 'v9' of "
        "org/plain: it holds dev (commit dddddddddddd, whose files it lacks), main (commit "
        f"aaaaaaaaaaaa), refs/convert/parquet (commit bbbbbbbbbbbb), {'c' * 40}"
    ) in lacking.stderr
    assert f"of org/other: it holds nothing of it (in {cache})" in absent.stderr


def test_a_hub_cache_holding_part_of_a_split_s_numbered_shards_is_an_error(
    tmp_path: Path,
) -> None:
    """snapshot_download offline returns the snapshot folder whatever it holds: a split
    downloaded in part was read as the whole, silently."""
    cache = tmp_path / "hub"
    snapshot = _snapshot(cache, "org/plain", "main", "a" * 40)
    _parquet(snapshot / "data" / "train-00000-of-00003.parquet", "train", 3)
    _parquet(snapshot / "data" / "train-00002-of-00003.parquet", "train", 2)
    done = _run_offline(cache, "hf://org/plain/train", tmp_path)
    assert done.returncode != 0
    assert "the hub cache holds 2 of the 3 shards of 'hf://org/plain/train'" in done.stderr
    assert "data/train-00001-of-00003*.parquet" in done.stderr
    # shards named with a suffix of their own each (datasets' push_to_hub) group together
    check_complete("hf://o/n/train", [f"d/train-0000{i}-of-00002-{i}f3a.parquet" for i in (0, 1)])


_READ_ONLINE = """
import json, pickle, sys, urllib.error, urllib.request
from zephon_torch.io import Dataset
url, endpoint, retry = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
dataset = Dataset.from_path("hf", url, io_options={"retry": retry})
opened = [s.num_rows for s in dataset.shards]
if endpoint:  # a request the hub does not know marks its log: reads come next
    try:
        urllib.request.urlopen(endpoint + "/opened")
    except urllib.error.HTTPError:
        pass
from huggingface_hub import HfFileSystem
HfFileSystem.clear_instance_cache()  # a DataLoader worker in another process: its own client
copy = pickle.loads(pickle.dumps(dataset))
last = copy.read_rows(len(copy.shards) - 1, [0])
rows = [r for n, s in enumerate(dataset.shards) for r in dataset.read_rows(n, range(s.num_rows))]
assert last == [rows[-copy.shards[-1].num_rows]]
shards = [s.path for s in dataset.shards]
print(json.dumps({"format": dataset.format, "rows": rows, "shards": shards}))
"""


def _read_online(
    url: str,
    endpoint: str,
    tmp_path: Path,
    *,
    fails: bool = False,
    retry: dict[str, Any] | None = None,
    **env: str,
) -> dict[str, Any]:
    """Reads `url` in a fresh interpreter against the hub at `endpoint` (HF_ENDPOINT in `env`
    overrides it and leaves out the log marker): the rows, or with `fails` its stderr."""
    environment = {
        **os.environ,
        "HF_ENDPOINT": endpoint,
        "HF_HUB_CACHE": str(tmp_path / "hub"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "ZEPHON_TORCH_CACHE": str(tmp_path / "zt"),
        **env,
    }
    environment.pop("HF_HUB_OFFLINE", None)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _READ_ONLINE,
            url,
            endpoint if "HF_ENDPOINT" not in env else "",
            json.dumps(retry or {"attempts": 2, "initial_delay": 0.01}),
        ],
        check=False,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if fails:
        assert done.returncode != 0, done.stdout
        return {"stderr": done.stderr}
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["stderr"] = done.stderr
    return result


def _is_data(path: str) -> bool:
    """A request for a data file (the card is read at every open, for its `configs:`)."""
    return "/resolve/" in path and not path.endswith("/README.md")


def _plain_repo(folder: Path) -> None:
    _parquet(folder / "data" / "train-00000-of-00002.parquet", "train", 300)
    _parquet(folder / "data" / "train-00001-of-00002.parquet", "train", 200)
    _parquet(folder / "data" / "test-00000-of-00001.parquet", "test", 4)
    (folder / "README.md").write_text("# card")


def _plain_hub(folder: Path) -> Hub:
    """A stand-in hub holding `_plain_repo` as org/plain at main."""
    hub = Hub()
    _plain_repo(folder)
    hub.add("org/plain", "main", folder)
    return hub


def test_online_a_split_is_listed_then_read_shard_by_shard_into_the_shard_cache(
    tmp_path: Path,
) -> None:
    hub = _plain_hub(tmp_path / "repo")
    with serve(hub) as endpoint:
        result = _read_online("hf://org/plain/train", endpoint, tmp_path)
    assert result["format"] == "parquet"
    texts = [row["text"] for row in result["rows"]]
    assert texts == [f"train {i}" for i in range(300)] + [f"train {i}" for i in range(200)]
    sha = Hub.sha("org/plain", "main", tmp_path / "repo")  # read at the listed commit
    assert result["shards"] == [
        f"hf://datasets/org/plain@{sha}/data/train-0000{n}-of-00002.parquet" for n in range(2)
    ]
    marker = hub.log.index(("GET", "/opened", ""))
    data = [(i, path, asked) for i, (_, path, asked) in enumerate(hub.log) if _is_data(path)]
    files = [(path, asked) for _, path, asked in data]
    opening = [(path, asked) for i, path, asked in data if i < marker]
    assert opening and all(asked for _, asked in opening)  # footers by range: no download
    whole = {path.rsplit("/", 1)[-1] for path, asked in files if not asked}
    # each shard downloaded by huggingface_hub's own download, one request for the whole file
    # (a callback of another class sent it to fsspec's copy in 4 MiB ranges, one after another)
    assert whole == {f"train-0000{n}-of-00002.parquet" for n in range(2)}
    assert not any("test-" in path for path, _ in files)  # the other split: never fetched
    shards = (tmp_path / "zt" / "shards").iterdir()
    cached = {p.name.split("-", 1)[1] for p in shards if not p.name.startswith(".")}
    assert cached == {f"train-0000{n}-of-00002.parquet" for n in range(2)}
    assert not (tmp_path / "hub").exists() or not any((tmp_path / "hub").rglob("*.parquet"))


def test_online_the_auto_converted_parquet_is_read_when_main_has_no_data_files(
    tmp_path: Path,
) -> None:
    hub = Hub()
    (tmp_path / "main").mkdir()
    (tmp_path / "main" / "README.md").write_text("# a dataset with a loading script")
    (tmp_path / "main" / "conv.py").write_text("# builder")
    converted = tmp_path / "converted"
    _parquet(converted / "wiki" / "train" / "0000.parquet", "wiki-train", 3)
    _parquet(converted / "wiki" / "partial-validation" / "0000.parquet", "wiki-val", 2)
    _parquet(converted / "other" / "train" / "0000.parquet", "other", 1)
    hub.add("org/conv", "main", tmp_path / "main")
    hub.add("org/conv", "refs/convert/parquet", converted)
    with serve(hub) as endpoint:
        train = _read_online("hf://org/conv/wiki/train", endpoint, tmp_path)
        validation = _read_online("hf://org/conv/wiki/validation", endpoint, tmp_path)
    assert [row["text"] for row in train["rows"]] == [f"wiki-train {i}" for i in range(3)]
    assert [row["text"] for row in validation["rows"]] == ["wiki-val 0", "wiki-val 1"]
    sha = Hub.sha("org/conv", "refs/convert/parquet", converted)
    assert train["shards"] == [f"hf://datasets/org/conv@{sha}/wiki/train/0000.parquet"]


def test_online_a_split_the_dataset_card_defines_is_read_from_its_data_files(
    tmp_path: Path,
) -> None:
    hub = Hub()
    main = tmp_path / "main"
    _parquet(main / "data" / "CC-1" / "000_00000.parquet", "crawl-1", 3)
    _parquet(main / "data" / "CC-2" / "000_00000.parquet", "crawl-2", 2)
    (main / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n"
        "    path: data/*/*\n---\n"
    )
    converted = tmp_path / "converted"
    _parquet(converted / "default" / "partial-train" / "0000.parquet", "partial", 1)
    hub.add("org/fw", "main", main)
    hub.add("org/fw", "refs/convert/parquet", converted)
    with serve(hub) as endpoint:
        train = _read_online("hf://org/fw/train", endpoint, tmp_path)
    expected = ["crawl-1 0", "crawl-1 1", "crawl-1 2", "crawl-2 0", "crawl-2 1"]
    assert [row["text"] for row in train["rows"]] == expected


def test_a_card_s_data_files_of_another_type_is_a_config_error_naming_the_card(
    tmp_path: Path,
) -> None:
    """Online and from the hub cache: a `path: 5` raised TypeError ('int' object is not
    iterable), a glob with a reversed range `[z-a]` re.error (bad character range)."""
    hub = Hub()
    main = tmp_path / "main"
    _parquet(main / "data" / "train-00000-of-00001.parquet", "train", 2)
    (main / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: 5\n---\n"
    )
    hub.add("org/odd", "main", main)
    with serve(hub) as endpoint:
        online = _read_online("hf://org/odd/train", endpoint, tmp_path, fails=True)
    assert (
        "ConfigError: the dataset card hf://datasets/org/odd@main/README.md: " in online["stderr"]
    )
    assert "got [{'path': 5, 'split': 'train'}]" in online["stderr"]
    snapshot = _snapshot(tmp_path / "cache", "org/odd", "main", "a" * 40)
    _parquet(snapshot / "data" / "train-00000-of-00001.parquet", "train", 2)
    (snapshot / "README.md").write_text("---\nconfigs:\n- data_files: 'data/[z-a]*'\n---\n")
    offline = _run_offline(tmp_path / "cache", "hf://org/odd/train", tmp_path).stderr
    assert (
        f"ConfigError: the dataset card {snapshot / 'README.md'}: the glob 'data/[z-a]*'" in offline
    )


def test_online_a_pinned_revision_reads_its_commit_after_the_branch_moved(
    tmp_path: Path,
) -> None:
    hub = Hub()
    _parquet(tmp_path / "v1" / "data" / "train-00000-of-00001.parquet", "old", 3)
    _parquet(tmp_path / "v2" / "data" / "train-00000-of-00001.parquet", "new", 3)
    hub.add("org/moved", "main", tmp_path / "v1")
    first = Hub.sha("org/moved", "main", tmp_path / "v1")
    hub.add("org/moved", "main", tmp_path / "v2")
    with serve(hub) as endpoint:
        latest = _read_online("hf://org/moved/train", endpoint, tmp_path)
        pinned = _read_online(f"hf://org/moved@{first}/train", endpoint, tmp_path)
    assert [row["text"] for row in latest["rows"]] == ["new 0", "new 1", "new 2"]
    assert [row["text"] for row in pinned["rows"]] == ["old 0", "old 1", "old 2"]
    assert pinned["shards"][0].startswith(f"hf://datasets/org/moved@{first}/")


def test_online_a_revision_the_repo_lacks_is_named_with_its_branches(tmp_path: Path) -> None:
    hub = _plain_hub(tmp_path / "repo")
    hub.add("org/plain", "dev", tmp_path / "repo")
    hub.add("org/plain", "refs/convert/parquet", tmp_path / "repo")
    with serve(hub) as endpoint:
        failed = _read_online("hf://org/plain@v9/train", endpoint, tmp_path, fails=True)
    assert (
        "ConfigError: no revision 'v9' in org/plain: it has the branches dev, main and the "
        "tags none (or name a commit)"
    ) in failed["stderr"]


def test_online_a_hub_that_cannot_be_reached_leaves_the_hub_cache_to_read(
    tmp_path: Path,
) -> None:
    snapshot = _snapshot(tmp_path / "hub", "org/plain", "main", "a" * 40)
    _plain_repo(snapshot)
    with serve(Hub()) as endpoint:
        pass  # now closed: nothing listens there
    result = (
        _read_online(  # at once: a refused connection is not waited on (150 s, past the 120 s run)
            "hf://org/plain/train",
            endpoint,
            tmp_path,
            retry={"attempts": 2, "initial_delay": 150, "max_delay": 150, "timeout": 1000},
            HF_ENDPOINT=endpoint,
        )
    )
    assert len(result["rows"]) == 500
    assert "reading the hub cache" in result["stderr"]


def test_online_a_hub_that_takes_the_connection_and_never_answers_leaves_the_cache_to_read(
    tmp_path: Path,
) -> None:
    """huggingface_hub's client waits for an answer without limit: a hub that took the
    connection and said nothing (a proxy, a stalled server) held the open for ever, the
    complete hub cache unread. The first request now waits `HF_HUB_ETAG_TIMEOUT`."""
    snapshot = _snapshot(tmp_path / "hub", "org/plain", "main", "a" * 40)
    _plain_repo(snapshot)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # connections complete in the backlog, never accepted nor answered
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        result = _read_online(
            "hf://org/plain/train",
            endpoint,
            tmp_path,
            HF_ENDPOINT=endpoint,
            HF_HUB_ETAG_TIMEOUT="1",
        )
    assert len(result["rows"]) == 500
    assert "the hub cannot be reached" in result["stderr"]


@pytest.mark.parametrize("silent", ["tree", "commits"])
def test_online_a_hub_going_silent_after_the_commit_leaves_the_cache_to_read(
    tmp_path: Path, silent: str
) -> None:
    """The listing's requests (the file tree; a pinned commit's look at the converted branch's
    commits) take no timeout in huggingface_hub, and its client has none: a hub that answered
    the commit's request, then went silent, held the open for ever. Each now waits the retry
    policy's `timeout`, then the hub cache is read."""
    hub = _plain_hub(tmp_path / "repo")
    sha = hub.head("org/plain", "main")
    _plain_repo(_snapshot(tmp_path / "hub", "org/plain", "main", sha))
    hub.silent.add(silent)
    url = "hf://org/plain/train" if silent == "tree" else f"hf://org/plain@{sha}/train"
    with serve(hub) as endpoint:
        result = _read_online(url, endpoint, tmp_path, retry={"attempts": 1, "timeout": 1})
    assert len(result["rows"]) == 500
    assert "the hub cannot be reached" in result["stderr"]
    assert "no answer from the hub in 1 s" in result["stderr"]


def test_online_a_commit_landing_mid_run_does_not_change_what_is_read(tmp_path: Path) -> None:
    """Shards are read at the commit the branch pointed at when the dataset was opened (the
    hub's converter rewrites `refs/convert/parquet` while jobs read it)."""
    hub = Hub()
    _plain_repo(tmp_path / "v1")
    for number, count in enumerate((300, 200)):  # the same names, other rows
        path = tmp_path / "v2" / "data" / f"train-0000{number}-of-00002.parquet"
        _parquet(path, "moved", count)
    hub.add("org/plain", "main", tmp_path / "v1")
    hub.on_unknown = lambda path: hub.add("org/plain", "main", tmp_path / "v2")  # on "/opened"
    with serve(hub) as endpoint:
        result = _read_online("hf://org/plain/train", endpoint, tmp_path)
    assert hub.repos["org/plain"]["main"] == tmp_path / "v2"  # it moved before the reads
    assert {row["text"].split()[0] for row in result["rows"]} == {"train"}


def test_online_a_repo_that_is_missing_or_denied_is_a_config_error_at_once(
    tmp_path: Path,
) -> None:
    hub = _plain_hub(tmp_path / "repo")
    with serve(hub) as endpoint:
        missing = _read_online("hf://org/absent/train", endpoint, tmp_path, fails=True)
        hub.fail["tree"] = [403]
        denied = _read_online("hf://org/plain/train", endpoint, tmp_path, fails=True)
        trees = [path for _, path, _ in hub.log if "/tree/" in path]
    assert "ConfigError" in missing["stderr"] and "org/absent" in missing["stderr"]
    assert "ConfigError" in denied["stderr"] and "403" in denied["stderr"]
    assert "hub cache" not in missing["stderr"] + denied["stderr"]  # no fallback
    assert len(trees) == 1  # a 403 is not retried


def test_online_a_hub_that_cannot_be_reached_with_an_empty_cache_is_a_config_error(
    tmp_path: Path,
) -> None:
    with serve(Hub()) as endpoint:
        pass  # closed: nothing listens there
    failed = _read_online(
        "hf://org/plain/train", endpoint, tmp_path, fails=True, HF_ENDPOINT=endpoint
    )
    assert "the hub cannot be reached" in failed["stderr"]
    # the cache looked in is named: a job given another HF_HOME than the download's
    hub_cache = str(tmp_path / "hub")
    assert (
        f"ConfigError: no files found at 'hf://org/plain/train' in the hub cache {hub_cache!r}"
        in (failed["stderr"])
    )


def test_a_url_that_names_no_hub_repo_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="does not name a hub repo"):
        Dataset.from_path("hf", "hf://org/bad..name/train")


def test_online_a_busy_hub_is_retried(tmp_path: Path) -> None:
    hub = _plain_hub(tmp_path / "repo")
    hub.fail["revision"] = [503]  # the first ask for the commit (the read retries twice)
    hub.fail["tree"] = [429]
    with serve(hub) as endpoint:
        result = _read_online("hf://org/plain/train", endpoint, tmp_path)
    assert len(result["rows"]) == 500 and hub.fail == {"revision": [], "tree": []}


def test_online_a_commit_that_leaves_the_shards_alone_downloads_nothing_again(
    tmp_path: Path,
) -> None:
    """The cache knows a hub file by its path and blob id, not by the commit it was read at."""
    hub = _plain_hub(tmp_path / "v1")
    with serve(hub) as endpoint:
        first = _read_online("hf://org/plain/train", endpoint, tmp_path)
        shutil.copytree(tmp_path / "v1", tmp_path / "v2")
        (tmp_path / "v2" / "README.md").write_text("# a new card")
        hub.add("org/plain", "main", tmp_path / "v2")
        hub.log.clear()
        second = _read_online("hf://org/plain/train", endpoint, tmp_path)
    assert second["rows"] == first["rows"]
    assert second["shards"] != first["shards"]  # read at the new commit
    assert [path for _, path, _ in hub.log if _is_data(path)] == []  # nor footers


_PIPELINE = """
import hashlib, json, sys
from zephon_torch import Pipeline
from zephon_torch.io import Dataset
from zephon_torch.torch import DataLoader
from zephon_torch.work import StaticMixtureWorkSource


def digests(path, workers):
    dataset = Dataset.from_path("t", path, token_columns=["input_ids"])
    source = StaticMixtureWorkSource(
        [dataset], seed=3, exhaustion="stop", shuffle_window_shards=2
    )
    pipeline = (
        Pipeline(source).options(canonical_replicas=2)
        .pretokenized("input_ids").pack_flat(32).batch(2)
    )
    options = {"num_workers": workers, "multiprocessing_context": "spawn"} if workers else {}
    loader = DataLoader(pipeline, **options)
    return [hashlib.sha1(item["input_ids"].numpy().tobytes()).hexdigest() for item in loader]


if __name__ == "__main__":
    hub, local = digests(sys.argv[1], 2), digests(sys.argv[2], 0)
    print(json.dumps({"hub": hub, "local": local}))
"""


def test_online_dataloader_workers_give_the_batches_of_the_local_copy(tmp_path: Path) -> None:
    """Each spawned worker unpickles the dataset and reads the hub at the listed commit with a
    client of its own; the batches are those of the same files read locally in one process."""
    repo = tmp_path / "tokens"
    for shard in range(4):
        ids = [
            [shard * 1000 + row * 10 + i for i in range(3 + (row * 7) % 40)] for row in range(20)
        ]
        path = repo / "data" / f"train-0000{shard}-of-00004.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"input_ids": pa.array(ids, type=pa.list_(pa.int32()))}), path)
    hub = Hub()
    hub.add("org/tokens", "main", repo)
    script = tmp_path / "pipeline.py"
    script.write_text(_PIPELINE)
    environment = {
        **os.environ,
        "HF_HUB_CACHE": str(tmp_path / "hub"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "ZEPHON_TORCH_CACHE": str(tmp_path / "zt"),
    }
    environment.pop("HF_HUB_OFFLINE", None)
    with serve(hub) as endpoint:
        done = subprocess.run(
            [sys.executable, str(script), "hf://org/tokens/train", str(repo / "data")],
            check=False,
            env={**environment, "HF_ENDPOINT": endpoint},
            capture_output=True,
            text=True,
            timeout=180,
        )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(result["local"]) > 10
    assert result["hub"] == result["local"]
    downloaded = {path.rsplit("/", 1)[-1] for _, path, asked in hub.log if "/resolve/" in path}
    assert downloaded == {f"train-0000{shard}-of-00004.parquet" for shard in range(4)}


def _script_repo(folder: Path) -> Path:
    """A main commit with a loading script and no data files: its splits are the hub's
    converted Parquet."""
    folder.mkdir()
    (folder / "README.md").write_text("# a dataset with a loading script")
    (folder / "builder.py").write_text("# builder")
    return folder


def _download(
    endpoint: str, cache: Path, repo: str, patterns: list[str], revision: str = "main"
) -> None:
    """`snapshot_download` of `patterns` only, as `hf download --include` does: the hub cache
    then holds the repository's file listing and part of its files."""
    code = (
        "import sys; from huggingface_hub import snapshot_download; "
        "snapshot_download(sys.argv[1], repo_type='dataset', revision=sys.argv[2], "
        "allow_patterns=sys.argv[3:])"
    )
    env = {**os.environ, "HF_ENDPOINT": endpoint, "HF_HUB_CACHE": str(cache)}
    env.pop("HF_HUB_OFFLINE", None)
    command = [sys.executable, "-c", code, repo, revision, *patterns]
    subprocess.run(command, env=env, check=True, timeout=60)


def test_offline_a_split_downloaded_alone_reads_and_a_missing_card_is_named(
    tmp_path: Path,
) -> None:
    """huggingface_hub calls a snapshot incomplete when a listed file matching the patterns
    asked for is missing: `*train*` matched another split's `train_sft-*` and a cached split
    was 'not found'. Without the card, the split was chosen by file names, not by the card's
    configs: other files than online, silently."""
    repo = tmp_path / "repo"
    _parquet(repo / "data" / "train-00000-of-00001.parquet", "train", 3)
    _parquet(repo / "data" / "train_sft-00000-of-00001.parquet", "sft", 2)
    _parquet(repo / "data" / "test-00000-of-00001.parquet", "test", 2)
    (repo / "README.md").write_text("# card")
    hub = Hub()
    hub.add("org/r", "main", repo)
    with serve(hub) as endpoint:
        _download(endpoint, tmp_path / "split", "org/r", ["data/train-*", "README.md"])
        _download(endpoint, tmp_path / "cardless", "org/r", ["data/*"])
    result = _read_offline(tmp_path / "split", "hf://org/r/train", tmp_path)
    assert [row["text"] for row in result["rows"]] == ["train 0", "train 1", "train 2"]
    done = _run_offline(tmp_path / "cardless", "hf://org/r/train", tmp_path)
    assert done.returncode != 0
    assert "ConfigError: 'hf://org/r/train': the hub cache holds 'org/r' without its " in (
        done.stderr
    )


def test_the_converted_parquet_s_only_config_is_read_and_a_missing_one_names_what_there_is(
    tmp_path: Path,
) -> None:
    """With no config named, the converted layout was looked up under `default/` only: a
    dataset whose one config has another name was "not found". Errors now list the configs
    or splits there are, online and offline; a converted split cached in part is named."""
    script = _script_repo(tmp_path / "script")
    one = tmp_path / "one"
    _parquet(one / "en" / "train" / "0000.parquet", "en-train-0", 2)
    _parquet(one / "en" / "train" / "0001.parquet", "en-train-1", 1)
    _parquet(one / "en" / "partial-validation" / "0000.parquet", "en-val", 1)
    two = tmp_path / "two"
    _parquet(two / "en" / "train" / "0000.parquet", "en", 1)
    _parquet(two / "fr" / "train" / "0000.parquet", "fr", 1)
    hub = Hub()
    for name, converted in (("org/one", one), ("org/two", two)):
        hub.add(name, "main", script)
        hub.add(name, "refs/convert/parquet", converted)
    expected = ["en-train-0 0", "en-train-0 1", "en-train-1 0"]
    with serve(hub) as endpoint:
        train = _read_online("hf://org/one/train", endpoint, tmp_path)
        assert [row["text"] for row in train["rows"]] == expected
        test = _read_online("hf://org/one/test", endpoint, tmp_path, fails=True)["stderr"]
        assert "no split 'test' in config 'en' (splits: ['train', 'validation'])" in test
        both = _read_online("hf://org/two/train", endpoint, tmp_path, fails=True)["stderr"]
        assert "configs ['en', 'fr']: name one, hf://org/name/CONFIG/split" in both
        other = _read_online("hf://org/two/de/train", endpoint, tmp_path, fails=True)["stderr"]
        assert "no config 'de' (configs: ['en', 'fr'])" in other
        convert = "refs/convert/parquet"
        _download(endpoint, tmp_path / "whole", "org/one", ["en/train/*"], convert)
        _download(endpoint, tmp_path / "part", "org/one", ["en/train/0000.parquet"], convert)
    offline = _read_offline(tmp_path / "whole", "hf://org/one/train", tmp_path)
    assert [row["text"] for row in offline["rows"]] == expected
    done = _run_offline(tmp_path / "part", "hf://org/one/train", tmp_path)
    assert done.returncode != 0
    assert "the hub cache holds only part of 'hf://org/one/train'" in done.stderr
    assert "en/train/0001.parquet" in done.stderr


def test_offline_a_split_cached_in_part_whose_files_are_not_numbered_is_named(
    tmp_path: Path,
) -> None:
    """Only `-00001-of-00004` numbers told a cache holding part of an uploaded split: one of
    files named otherwise (a card's `data/*/*`, a `train/` folder) read the part as the whole,
    the rest of the split lost without a word. The listing huggingface_hub keeps of the whole
    commit now says what the split holds."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n"
        "    path: data/*/*\n---\n"
    )
    _parquet(repo / "data" / "CC-1" / "000_00000.parquet", "crawl-1", 3)
    _parquet(repo / "data" / "CC-2" / "000_00000.parquet", "crawl-2", 2)
    plain = tmp_path / "plain"
    _parquet(plain / "train" / "part-a.parquet", "a", 2)
    (plain / "README.md").write_text("# card")
    _parquet(plain / "train" / "part-b.parquet", "b", 2)
    hub = Hub()
    hub.add("org/fw", "main", repo)
    hub.add("org/plain", "main", plain)
    with serve(hub) as endpoint:
        _download(endpoint, tmp_path / "fw", "org/fw", ["README.md", "data/CC-1/*"])
        _download(endpoint, tmp_path / "plain-part", "org/plain", ["README.md", "train/part-a*"])
        _download(endpoint, tmp_path / "plain-whole", "org/plain", ["README.md", "train/*"])
    for cache, url, missing in (
        ("fw", "hf://org/fw/train", "data/CC-2/000_00000.parquet"),
        ("plain-part", "hf://org/plain/train", "train/part-b.parquet"),
    ):
        done = _run_offline(tmp_path / cache, url, tmp_path)
        assert done.returncode != 0
        assert f"the hub cache holds only part of {url!r}: 1 of its 2 files are missing " in (
            done.stderr
        )
        assert f"({missing})" in done.stderr
    whole = _read_offline(tmp_path / "plain-whole", "hf://org/plain/train", tmp_path)
    assert [row["text"] for row in whole["rows"]] == ["a 0", "a 1", "b 0", "b 1"]


def test_a_pinned_commit_of_the_converted_parquet_reads_what_the_unpinned_url_read(
    tmp_path: Path,
) -> None:
    """Pinned, as the fingerprint records it to resume on, a commit of the converted Parquet
    was read by the rules of uploaded files: every config's `train/` folder, mixed (and,
    offline, without the check of a split cached in part)."""
    script = _script_repo(tmp_path / "script")
    converted = tmp_path / "converted"
    _parquet(converted / "default" / "train" / "0000.parquet", "default", 2)
    _parquet(converted / "other" / "train" / "0000.parquet", "other", 2)
    again = tmp_path / "again"  # converted anew later: the pinned commit is an older one
    _parquet(again / "default" / "train" / "0000.parquet", "again", 1)
    hub = Hub()
    hub.add("org/conv", "main", script)
    hub.add("org/conv", "refs/convert/parquet", converted)
    first = Hub.sha("org/conv", "refs/convert/parquet", converted)
    uploaded = Hub.sha("org/conv", "main", script)
    expected = ["default 0", "default 1"]
    with serve(hub) as endpoint:
        for url in (
            "hf://org/conv/train",
            f"hf://org/conv@{first}/train",
            "hf://org/conv@refs%2Fconvert%2Fparquet/train",
        ):
            assert [row["text"] for row in _read_online(url, endpoint, tmp_path)["rows"]] == (
                expected
            ), url
        hub.add("org/conv", "refs/convert/parquet", again)
        pinned = _read_online(f"hf://org/conv@{first}/train", endpoint, tmp_path)
        assert [row["text"] for row in pinned["rows"]] == expected
        # a commit of main is read as uploaded files only: no converted rules on it
        err = _read_online(f"hf://org/conv@{uploaded}/train", endpoint, tmp_path, fails=True)
        assert (
            f"'hf://org/conv@{uploaded}/train': {uploaded}: no files of split 'train'"
            in (err["stderr"])
        )
    cache = tmp_path / "cache"
    offline = _snapshot(cache, "org/conv", "refs/convert/parquet", "c" * 40)
    _parquet(offline / "default" / "train" / "0000.parquet", "default", 2)
    _parquet(offline / "other" / "train" / "0000.parquet", "other", 2)
    for url in ("hf://org/conv/train", f"hf://org/conv@{'c' * 40}/train"):
        assert [row["text"] for row in _read_offline(cache, url, tmp_path)["rows"]] == expected
    # an older conversion, which no cached ref names: offline, its layout cannot be told, and
    # the two readings differ; with the config named they agree
    older = cache / "datasets--org--conv" / "snapshots" / ("e" * 40)
    _parquet(older / "default" / "train" / "0000.parquet", "default", 2)
    _parquet(older / "other" / "train" / "0000.parquet", "other", 2)
    done = _run_offline(cache, f"hf://org/conv@{'e' * 40}/train", tmp_path)
    assert done.returncode != 0
    assert "may be of the hub's auto-converted Parquet or of uploaded files, and the two " in (
        done.stderr
    )
    named = _read_offline(cache, f"hf://org/conv@{'e' * 40}/default/train", tmp_path)
    assert [row["text"] for row in named["rows"]] == expected


def test_a_revision_named_with_a_slash_is_pinned_with_2f(tmp_path: Path) -> None:
    """`@release/v1` cannot be told from a config folder in the URL; `%2F` stands for the `/`
    (as on the hub's file system), and the error of the first form says so."""
    cache = tmp_path / "hub"
    _parquet(_snapshot(cache, "org/p", "release/v1", "d" * 40) / "train.parquet", "v1", 2)
    _parquet(_snapshot(cache, "org/p", "main", "a" * 40) / "train.parquet", "main", 1)
    pinned = _read_offline(cache, "hf://org/p@release%2Fv1/train", tmp_path)
    assert [row["text"] for row in pinned["rows"]] == ["v1 0", "v1 1"]
    assert pinned_revision("hf://org/p@release%2Fv1/train") == "release/v1"
    done = _run_offline(cache, "hf://org/p@release/v1/train", tmp_path)
    assert done.returncode != 0
    assert "holds no revision 'release' of org/p: it holds main (commit aaaaaaaaaaaa), " in (
        done.stderr
    )
    assert "is written %2F in the URL: @release%2Fv1" in done.stderr
    missing = _run_offline(cache, "hf://org/p/en/train", tmp_path)
    assert "main: no config folder 'en'" in missing.stderr


_READ_TOKENS = """
import json, sys
from zephon_torch.io import Dataset
dataset = Dataset.from_path("hf", sys.argv[1])
ids = [
    ids.tolist()
    for n, shard in enumerate(dataset.shards)
    for ids in dataset.read_tokens(n, range(shard.num_rows), "input_ids")
]
fingerprint = {k: v for k, v in dataset.fingerprint().items() if k != "revision"}
print(json.dumps({"ids": ids, "fingerprint": fingerprint}))
"""


def _read_tokens(url: str, tmp_path: Path, **env: str) -> dict[str, Any]:
    """The token ids and fingerprint (less the commit) of `url` read in a fresh interpreter
    with `env` (HF_ENDPOINT online, or HF_HUB_OFFLINE=1)."""
    environment = {**os.environ, "ZEPHON_TORCH_CACHE": str(tmp_path / "zt"), **env}
    environment.setdefault("HF_HUB_CACHE", str(tmp_path / "hub"))
    if "HF_HUB_OFFLINE" not in env:
        environment.pop("HF_HUB_OFFLINE", None)
    command = [sys.executable, "-c", _READ_TOKENS, url]
    done = subprocess.run(
        command, check=False, env=environment, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _token_file(path: Path, documents: list[list[int]]) -> None:
    """A 1-D `.npy` token file and its `.offsets.npy` beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, np.array([t for document in documents for t in document], dtype=np.int32))
    offsets = np.cumsum([0] + [len(document) for document in documents])
    np.save(path.with_name(path.name[: -len(".npy")] + ".offsets.npy"), offsets)


@pytest.mark.parametrize("layout", ["by name", "card"])
def test_a_split_of_1d_token_files_without_their_offsets_reads_as_the_local_files(
    tmp_path: Path, layout: str
) -> None:
    """A split whose files are 1-D `.npy` token files and not their offsets files (`train.npy`
    beside `train.offsets.npy`, or a card's `data/?.npy`) was refused online for lacking the
    offsets (DataError), where the hub cache and a local path read the offsets beside them."""
    repo = tmp_path / "repo"
    if layout == "by name":
        _token_file(repo / "train.npy", [[1, 2, 3], [4], [5, 6]])
        _token_file(repo / "test.npy", [[9]])
        (repo / "README.md").write_text("# card")
        local = repo / "train.npy"
    else:
        _token_file(repo / "data" / "a.npy", [[1, 2, 3], [4], [5, 6]])
        _token_file(repo / "data" / "b.npy", [[7, 8], [9]])
        (repo / "README.md").write_text(
            "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n"
            "    path: data/?.npy\n---\n"
        )
        local = repo / "data" / "?.npy"
    dataset = Dataset.from_path("hf", str(local), index_cache_dir=str(tmp_path / "index"))
    fingerprint = dataset.fingerprint()
    ids = [
        ids.tolist()
        for n, shard in enumerate(dataset.shards)
        for ids in dataset.read_tokens(n, range(shard.num_rows), "input_ids") or []
    ]
    hub = Hub()
    hub.add("org/tokens", "main", repo)
    with serve(hub) as endpoint:
        online = _read_tokens("hf://org/tokens/train", tmp_path, HF_ENDPOINT=endpoint)
    cache = tmp_path / "cache"
    shutil.copytree(repo, _snapshot(cache, "org/tokens", "main", "a" * 40), dirs_exist_ok=True)
    offline = _read_tokens(
        "hf://org/tokens/train", tmp_path, HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1"
    )
    assert online == offline == {"ids": ids, "fingerprint": fingerprint}


def test_offline_a_split_cached_without_an_offsets_file_is_named_as_cached_in_part(
    tmp_path: Path,
) -> None:
    """A split of 1-D `.npy` token files downloaded without an `.offsets.npy` beside one
    (`hf download --include train.npy`) was a DataError of the token reader naming the
    offsets file, where any other file of the split missing from the hub cache is a
    ConfigError saying the cache holds only part of the split, to be downloaded. The offsets
    file of a 2-D token file, which has none, is not asked for."""
    repo = tmp_path / "repo"
    _token_file(repo / "train.npy", [[1, 2, 3], [4], [5, 6]])
    _token_file(repo / "test.npy", [[9]])
    (repo / "README.md").write_text("# card")
    flat = tmp_path / "flat-repo"
    flat.mkdir()
    np.save(flat / "train.npy", np.arange(6, dtype=np.int32).reshape(3, 2))
    (flat / "README.md").write_text("# card")
    hub = Hub()
    hub.add("org/tokens", "main", repo)
    hub.add("org/flat", "main", flat)
    with serve(hub) as endpoint:
        _download(endpoint, tmp_path / "part", "org/tokens", ["README.md", "train.npy"])
        _download(endpoint, tmp_path / "whole", "org/tokens", ["README.md", "train.*"])
        _download(endpoint, tmp_path / "flat", "org/flat", ["README.md", "train.npy"])
    url = "hf://org/tokens/train"
    done = _run_offline(tmp_path / "part", url, tmp_path)
    assert done.returncode != 0
    assert "ConfigError: the hub cache holds only part of 'hf://org/tokens/train': 1 of its " in (
        done.stderr
    )
    assert "are missing (train.offsets.npy); download the split" in done.stderr
    whole = _read_tokens(url, tmp_path, HF_HUB_CACHE=str(tmp_path / "whole"), HF_HUB_OFFLINE="1")
    assert whole["ids"] == [[1, 2, 3], [4], [5, 6]]
    rows = _read_tokens(
        "hf://org/flat/train", tmp_path, HF_HUB_CACHE=str(tmp_path / "flat"), HF_HUB_OFFLINE="1"
    )
    assert rows["ids"] == [[0, 1], [2, 3], [4, 5]]


_OPEN = """
import sys
from zephon_torch.io import Dataset
dataset = Dataset.from_path("hf", sys.argv[1], format=sys.argv[2] or None)
print(dataset.format, [shard.num_rows for shard in dataset.shards])
"""


def _open(url: str, format_: str | None, tmp_path: Path, **env: str) -> str:
    """What opening `url` as `format_` in a fresh interpreter with `env` (HF_ENDPOINT online,
    or HF_HUB_OFFLINE=1) printed, stdout and stderr."""
    environment = {**os.environ, "ZEPHON_TORCH_CACHE": str(tmp_path / "zt"), **env}
    environment.setdefault("HF_HUB_CACHE", str(tmp_path / "hub"))
    if "HF_HUB_OFFLINE" not in env:
        environment.pop("HF_HUB_OFFLINE", None)
    command = [sys.executable, "-c", _OPEN, url, format_ or ""]
    done = subprocess.run(
        command, check=False, env=environment, capture_output=True, text=True, timeout=60
    )
    return done.stdout + done.stderr


def test_a_split_holding_an_mds_dataset_is_refused_not_read_as_json_lines(tmp_path: Path) -> None:
    """A split folder holding an MDS dataset (`train/index.json` and its `.mds` shards) was
    read as JSON Lines online and offline, one row of index, its shards left out (no data file
    ending), where the local folder reads its rows and a local glob of its files is refused;
    with `format="mds"` it read offline and failed online for a shard 'missing'."""
    repo = tmp_path / "repo"
    write_mds(repo / "train", [{"text": f"row {i}"} for i in range(4)], {"text": "str"})
    (repo / "README.md").write_text("# card")
    local = Dataset.from_path("hf", str(repo / "train"), index_cache_dir=str(tmp_path / "i"))
    assert local.format == "mds" and local.num_rows == 4
    hub = Hub()
    hub.add("org/mds", "main", repo)
    cache = tmp_path / "cache"
    shutil.copytree(repo, _snapshot(cache, "org/mds", "main", "a" * 40), dirs_exist_ok=True)
    offline = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    with serve(hub) as endpoint:
        for env in ({"HF_ENDPOINT": endpoint}, offline):
            detected = _open("hf://org/mds/train", None, tmp_path, **env)
            assert (
                "ConfigError: 'hf://org/mds/train': 'train/index.json' and the 1 MDS or LitData "
                "shard files beside it, e.g. 'train/shard.00000.mds', are an MDS or LitData "
                "dataset, which hf:// does not read"
            ) in detected, detected
            assert "--include 'train/*'" in detected
            named = _open("hf://org/mds/train", "mds", tmp_path, **env)
            assert "ConfigError: 'hf://org/mds/train': `format` is 'mds', but hf://" in named


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
        _parquet(repo / "data" / f"train-0000{shard}-of-00003.parquet", f"shard-{shard}", 2)
    (repo / "README.md").write_text("# card")
    local = Dataset.from_path("hf", str(repo / "data"), index_cache_dir=str(tmp_path / "i"))
    expected = [row["text"] for row in local.read_rows(0, [0, 1]) + local.read_rows(1, [0, 1])]
    hub = Hub()
    hub.add("org/gap", "main", repo)
    with serve(hub) as endpoint:
        online = _read_online("hf://org/gap/train", endpoint, tmp_path)
        _download(endpoint, tmp_path / "whole", "org/gap", ["*"])
        _download(endpoint, tmp_path / "part", "org/gap", ["README.md", "data/*00000*"])
    offline = _read_offline(tmp_path / "whole", "hf://org/gap/train", tmp_path)
    assert [row["text"] for row in online["rows"]] == expected
    assert [row["text"] for row in offline["rows"]] == expected
    part = _run_offline(tmp_path / "part", "hf://org/gap/train", tmp_path)
    assert "1 of its 2 files are missing (data/train-00002-of-00003.parquet)" in part.stderr


def test_offline_a_card_cached_without_its_split_is_not_read_from_the_converted_parquet(
    tmp_path: Path,
) -> None:
    """A cache holding main's card alone and the auto-converted Parquet read the converted
    split, another commit (a prefix, for a large split), where online read the uploaded
    files: main's cached listing says the split has files there, and the cache lacks them."""
    main = tmp_path / "main"
    _parquet(main / "data" / "train-00000-of-00001.parquet", "uploaded", 3)
    (main / "README.md").write_text("# card")
    converted = tmp_path / "converted"
    _parquet(converted / "default" / "train" / "0000.parquet", "converted", 3)
    hub = Hub()
    hub.add("org/both", "main", main)
    hub.add("org/both", "refs/convert/parquet", converted)
    with serve(hub) as endpoint:
        online = _read_online("hf://org/both/train", endpoint, tmp_path)
        assert [row["text"] for row in online["rows"]] == [f"uploaded {i}" for i in range(3)]
        _download(endpoint, tmp_path / "card", "org/both", ["README.md"])
        _download(endpoint, tmp_path / "card", "org/both", ["default/*"], "refs/convert/parquet")
    done = _run_offline(tmp_path / "card", "hf://org/both/train", tmp_path)
    assert done.returncode != 0
    assert "the hub cache holds only part of 'hf://org/both/train': 1 of its 1 files " in (
        done.stderr
    )
    assert "(data/train-00000-of-00001.parquet)" in done.stderr
    # the converted split, asked for by name, is read
    pinned = _read_offline(
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
    _parquet(repo / "data" / "train-00000-of-00002.parquet", "a", 2)
    _parquet(repo / "data" / "train-00001-of-00002.parquet", "b", 2)
    (repo / "data" / "test.jsonl").write_text('{"text": "x"}\n')
    (repo / "README.md").write_text("# card")
    hub = Hub()
    hub.add("org/lost", "main", repo)
    with serve(hub) as endpoint:
        _download(endpoint, tmp_path / "hub", "org/lost", ["*"])
    snapshot = next((tmp_path / "hub" / "datasets--org--lost" / "snapshots").iterdir())
    for lost in ("data/train-00001-of-00002.parquet", "data/test.jsonl"):
        os.remove(os.path.realpath(snapshot / lost))
    for url, lost in (
        ("hf://org/lost/train", "data/train-00001-of-00002.parquet"),
        ("hf://org/lost/test", "data/test.jsonl"),
    ):
        done = _run_offline(tmp_path / "hub", url, tmp_path)
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
    snapshot = _snapshot(cache, "org/card", "main", "a" * 40)
    _parquet(snapshot / "custom" / "x.parquet", "card", 3)
    _parquet(snapshot / "data" / "train.parquet", "by name", 2)
    card = (
        "---\nconfigs:\n- config_name: default\n  data_files:\n    train: custom/*.parquet\n---\n"
    )
    blob = cache / "datasets--org--card" / "blobs" / "1f2e"
    blob.parent.mkdir()
    blob.write_text(card)
    (snapshot / "README.md").symlink_to(os.path.relpath(blob, snapshot))
    read = _read_offline(cache, "hf://org/card/train", tmp_path)
    assert [row["text"] for row in read["rows"]] == ["card 0", "card 1", "card 2"]
    blob.unlink()
    done = _run_offline(cache, "hf://org/card/train", tmp_path)
    assert done.returncode != 0
    assert (
        "ConfigError: the hub cache holds only part of 'hf://org/card/train': the link of the "
        "dataset card README.md of org/card at commit aaaaaaaaaaaa"
    ) in done.stderr


def test_a_config_folder_the_repo_lacks_is_named_with_the_folders_there(tmp_path: Path) -> None:
    """`hf://org/name/de/train` on a repo without a card whose configs are its folders said
    "no config folder 'de'" alone, online and offline: which names a URL takes went unsaid."""
    repo = tmp_path / "repo"
    for config in ("en", "fr"):
        _parquet(repo / config / "train-00000-of-00001.parquet", config, 2)
    _parquet(repo / "_extra" / "train.parquet", "hidden", 1)
    (repo / "README.md").write_text("# card")
    hub = Hub()
    hub.add("org/langs", "main", repo)
    cache = tmp_path / "cache"
    shutil.copytree(repo, _snapshot(cache, "org/langs", "main", "a" * 40), dirs_exist_ok=True)
    offline = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    with serve(hub) as endpoint:
        for env in ({"HF_ENDPOINT": endpoint}, offline):
            said = _open("hf://org/langs/de/train", None, tmp_path, **env)
            assert (
                "main: no config folder 'de' (its folders with data files: ['en', 'fr'])" in said
            ), said
