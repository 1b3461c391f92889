"""`hf://` datasets read online from a stand-in for the hub on loopback (`tests/hub_server.py`),
shard by shard through the shard cache: listing, pinned revisions, a hub that cannot be
reached or goes silent (the hub cache is read instead), retries, and DataLoader workers."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.hf_repos import (
    PIPELINE,
    cache_snapshot,
    is_data,
    plain_hub,
    plain_repo,
    read_online,
    run_offline,
    write_split,
)
from tests.hub_server import Hub, serve
from zephon_torch.errors import ConfigError
from zephon_torch.io import Dataset
from zephon_torch.io._hf import backs_off_listings

pytest.importorskip("huggingface_hub")


def test_online_a_split_is_listed_then_read_shard_by_shard_into_the_shard_cache(
    tmp_path: Path,
) -> None:
    hub = plain_hub(tmp_path / "repo")
    with serve(hub) as endpoint:
        result = read_online("hf://org/plain/train", endpoint, tmp_path)
    assert result["format"] == "parquet"
    texts = [row["text"] for row in result["rows"]]
    assert texts == [f"train {i}" for i in range(300)] + [f"train {i}" for i in range(200)]
    sha = Hub.sha("org/plain", "main", tmp_path / "repo")  # read at the listed commit
    assert result["shards"] == [
        f"hf://datasets/org/plain@{sha}/data/train-0000{n}-of-00002.parquet" for n in range(2)
    ]
    marker = hub.log.index(("GET", "/opened", ""))
    data = [(i, path, asked) for i, (_, path, asked) in enumerate(hub.log) if is_data(path)]
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
    write_split(converted / "wiki" / "train" / "0000.parquet", "wiki-train", 3)
    write_split(converted / "wiki" / "partial-validation" / "0000.parquet", "wiki-val", 2)
    write_split(converted / "other" / "train" / "0000.parquet", "other", 1)
    hub.add("org/conv", "main", tmp_path / "main")
    hub.add("org/conv", "refs/convert/parquet", converted)
    with serve(hub) as endpoint:
        train = read_online("hf://org/conv/wiki/train", endpoint, tmp_path)
        validation = read_online("hf://org/conv/wiki/validation", endpoint, tmp_path)
    assert [row["text"] for row in train["rows"]] == [f"wiki-train {i}" for i in range(3)]
    assert [row["text"] for row in validation["rows"]] == ["wiki-val 0", "wiki-val 1"]
    sha = Hub.sha("org/conv", "refs/convert/parquet", converted)
    assert train["shards"] == [f"hf://datasets/org/conv@{sha}/wiki/train/0000.parquet"]


def test_online_a_split_the_dataset_card_defines_is_read_from_its_data_files(
    tmp_path: Path,
) -> None:
    hub = Hub()
    main = tmp_path / "main"
    write_split(main / "data" / "CC-1" / "000_00000.parquet", "crawl-1", 3)
    write_split(main / "data" / "CC-2" / "000_00000.parquet", "crawl-2", 2)
    (main / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n"
        "    path: data/*/*\n---\n"
    )
    converted = tmp_path / "converted"
    write_split(converted / "default" / "partial-train" / "0000.parquet", "partial", 1)
    hub.add("org/fw", "main", main)
    hub.add("org/fw", "refs/convert/parquet", converted)
    with serve(hub) as endpoint:
        train = read_online("hf://org/fw/train", endpoint, tmp_path)
    expected = ["crawl-1 0", "crawl-1 1", "crawl-1 2", "crawl-2 0", "crawl-2 1"]
    assert [row["text"] for row in train["rows"]] == expected


def test_a_card_s_data_files_of_another_type_is_a_config_error_naming_the_card(
    tmp_path: Path,
) -> None:
    """Online and from the hub cache: a `path: 5` raised TypeError ('int' object is not
    iterable), a glob with a reversed range `[z-a]` re.error (bad character range)."""
    hub = Hub()
    main = tmp_path / "main"
    write_split(main / "data" / "train-00000-of-00001.parquet", "train", 2)
    (main / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n    path: 5\n---\n"
    )
    hub.add("org/odd", "main", main)
    with serve(hub) as endpoint:
        online = read_online("hf://org/odd/train", endpoint, tmp_path, fails=True)
    assert (
        "ConfigError: the dataset card hf://datasets/org/odd@main/README.md: " in online["stderr"]
    )
    assert "got [{'path': 5, 'split': 'train'}]" in online["stderr"]
    snapshot = cache_snapshot(tmp_path / "cache", "org/odd", "main", "a" * 40)
    write_split(snapshot / "data" / "train-00000-of-00001.parquet", "train", 2)
    (snapshot / "README.md").write_text("---\nconfigs:\n- data_files: 'data/[z-a]*'\n---\n")
    offline = run_offline(tmp_path / "cache", "hf://org/odd/train", tmp_path).stderr
    assert (
        f"ConfigError: the dataset card {snapshot / 'README.md'}: the glob 'data/[z-a]*'" in offline
    )


def test_online_a_pinned_revision_reads_its_commit_after_the_branch_moved(
    tmp_path: Path,
) -> None:
    hub = Hub()
    write_split(tmp_path / "v1" / "data" / "train-00000-of-00001.parquet", "old", 3)
    write_split(tmp_path / "v2" / "data" / "train-00000-of-00001.parquet", "new", 3)
    hub.add("org/moved", "main", tmp_path / "v1")
    first = Hub.sha("org/moved", "main", tmp_path / "v1")
    hub.add("org/moved", "main", tmp_path / "v2")
    with serve(hub) as endpoint:
        latest = read_online("hf://org/moved/train", endpoint, tmp_path)
        pinned = read_online(f"hf://org/moved@{first}/train", endpoint, tmp_path)
    assert [row["text"] for row in latest["rows"]] == ["new 0", "new 1", "new 2"]
    assert [row["text"] for row in pinned["rows"]] == ["old 0", "old 1", "old 2"]
    assert pinned["shards"][0].startswith(f"hf://datasets/org/moved@{first}/")


def test_online_a_revision_the_repo_lacks_is_named_with_its_branches(tmp_path: Path) -> None:
    hub = plain_hub(tmp_path / "repo")
    hub.add("org/plain", "dev", tmp_path / "repo")
    hub.add("org/plain", "refs/convert/parquet", tmp_path / "repo")
    with serve(hub) as endpoint:
        failed = read_online("hf://org/plain@v9/train", endpoint, tmp_path, fails=True)
    assert (
        "ConfigError: no revision 'v9' in org/plain: it has the branches dev, main and the "
        "tags none (or name a commit)"
    ) in failed["stderr"]


def test_online_a_hub_that_cannot_be_reached_leaves_the_hub_cache_to_read(
    tmp_path: Path,
) -> None:
    snapshot = cache_snapshot(tmp_path / "hub", "org/plain", "main", "a" * 40)
    plain_repo(snapshot)
    with serve(Hub()) as endpoint:
        pass  # now closed: nothing listens there
    result = (
        read_online(  # at once: a refused connection is not waited on (150 s, past the 120 s run)
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
    snapshot = cache_snapshot(tmp_path / "hub", "org/plain", "main", "a" * 40)
    plain_repo(snapshot)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)  # connections complete in the backlog, never accepted nor answered
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
        result = read_online(
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
    hub = plain_hub(tmp_path / "repo")
    sha = hub.head("org/plain", "main")
    plain_repo(cache_snapshot(tmp_path / "hub", "org/plain", "main", sha))
    hub.silent.add(silent)
    url = "hf://org/plain/train" if silent == "tree" else f"hf://org/plain@{sha}/train"
    with serve(hub) as endpoint:
        result = read_online(url, endpoint, tmp_path, retry={"attempts": 1, "timeout": 1})
    assert len(result["rows"]) == 500
    assert "the hub cannot be reached" in result["stderr"]
    assert "no answer from the hub in 1 s" in result["stderr"]


def test_online_a_commit_landing_mid_run_does_not_change_what_is_read(tmp_path: Path) -> None:
    """Shards are read at the commit the branch pointed at when the dataset was opened (the
    hub's converter rewrites `refs/convert/parquet` while jobs read it)."""
    hub = Hub()
    plain_repo(tmp_path / "v1")
    for number, count in enumerate((300, 200)):  # the same names, other rows
        path = tmp_path / "v2" / "data" / f"train-0000{number}-of-00002.parquet"
        write_split(path, "moved", count)
    hub.add("org/plain", "main", tmp_path / "v1")
    hub.on_unknown = lambda path: hub.add("org/plain", "main", tmp_path / "v2")  # on "/opened"
    with serve(hub) as endpoint:
        result = read_online("hf://org/plain/train", endpoint, tmp_path)
    assert hub.repos["org/plain"]["main"] == tmp_path / "v2"  # it moved before the reads
    assert {row["text"].split()[0] for row in result["rows"]} == {"train"}


def test_online_a_repo_that_is_missing_or_denied_is_a_config_error_at_once(
    tmp_path: Path,
) -> None:
    hub = plain_hub(tmp_path / "repo")
    with serve(hub) as endpoint:
        missing = read_online("hf://org/absent/train", endpoint, tmp_path, fails=True)
        hub.fail["tree"] = [403]
        denied = read_online("hf://org/plain/train", endpoint, tmp_path, fails=True)
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
    failed = read_online(
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
    hub = plain_hub(tmp_path / "repo")
    hub.fail["revision"] = [503]  # the first ask for the commit (the read retries twice)
    hub.fail["tree"] = [429]
    with serve(hub) as endpoint:
        result = read_online("hf://org/plain/train", endpoint, tmp_path)
    assert len(result["rows"]) == 500 and hub.fail == {"revision": [], "tree": []}


def test_the_listing_is_retried_here_where_huggingface_hub_does_not_back_it_off() -> None:
    """Before huggingface_hub 2.1 a listing's first page was asked without its backoff, and
    the listing was asked once here: one 429 failed the open (the test above, on 1.25)."""
    import inspect

    import huggingface_hub
    from huggingface_hub.utils import _pagination

    # the first page asked through a plain session.get: no backoff
    asked_once = "session.get(" in inspect.getsource(_pagination)
    assert backs_off_listings(huggingface_hub.__version__) == (not asked_once)
    assert [backs_off_listings(v) for v in ("0.25.2", "2.0.0", "2.1.1", "10.0")] == [
        False,
        False,
        True,
        True,
    ]


def test_online_a_commit_that_leaves_the_shards_alone_downloads_nothing_again(
    tmp_path: Path,
) -> None:
    """The cache knows a hub file by its path and blob id, not by the commit it was read at."""
    hub = plain_hub(tmp_path / "v1")
    with serve(hub) as endpoint:
        first = read_online("hf://org/plain/train", endpoint, tmp_path)
        shutil.copytree(tmp_path / "v1", tmp_path / "v2")
        (tmp_path / "v2" / "README.md").write_text("# a new card")
        hub.add("org/plain", "main", tmp_path / "v2")
        hub.log.clear()
        second = read_online("hf://org/plain/train", endpoint, tmp_path)
    assert second["rows"] == first["rows"]
    assert second["shards"] != first["shards"]  # read at the new commit
    assert [path for _, path, _ in hub.log if is_data(path)] == []  # nor footers


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
    script.write_text(PIPELINE)
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
