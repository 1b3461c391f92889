"""Hub repositories and hub caches for the `hf://` tests (`tests/integration/test_hf_hub*.py`):
cached snapshots written by hand, repositories for the stand-in hub (`tests/hub_server.py`), and
reads in a fresh interpreter (huggingface_hub reads HF_HUB_OFFLINE and HF_ENDPOINT at import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tests.hub_server import Hub

_READ = """
import json, sys
from zephon_torch.io import Dataset
dataset = Dataset.from_path("hf", sys.argv[1])
rows = [r for n, s in enumerate(dataset.shards) for r in dataset.read_rows(n, range(s.num_rows))]
print(json.dumps({"format": dataset.format, "rows": rows, "fingerprint": dataset.fingerprint()}))
"""


def cache_snapshot(cache: Path, repo: str, ref: str, sha: str) -> Path:
    folder = cache / f"datasets--{repo.replace('/', '--')}"
    ref_file = folder / "refs" / ref
    ref_file.parent.mkdir(parents=True, exist_ok=True)
    ref_file.write_text(sha)
    snapshot = folder / "snapshots" / sha
    snapshot.mkdir(parents=True, exist_ok=True)
    return snapshot


def write_split(path: Path, split: str, count: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"text": [f"{split} {i}" for i in range(count)]}), path)


def read_offline(cache: Path, url: str, tmp_path: Path) -> dict[str, Any]:
    """The dataset's format and rows, and what the read printed to stderr."""
    done = run_offline(cache, url, tmp_path)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return {**result, "stderr": done.stderr}


def run_offline(
    cache: Path, url: str, tmp_path: Path, **env: str
) -> subprocess.CompletedProcess[str]:
    """Reads `url` offline from the hub cache `cache` in a fresh interpreter (with `env`)."""
    env = {
        **os.environ,
        "HF_HUB_CACHE": str(cache),
        "HF_HUB_OFFLINE": "1",
        "ZEPHON_TORCH_CACHE": str(tmp_path / "zt"),
        **env,
    }
    return subprocess.run(
        [sys.executable, "-c", _READ, url],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


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


def read_online(
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


def is_data(path: str) -> bool:
    """A request for a data file (the card is read at every open, for its `configs:`)."""
    return "/resolve/" in path and not path.endswith("/README.md")


def plain_repo(folder: Path) -> None:
    write_split(folder / "data" / "train-00000-of-00002.parquet", "train", 300)
    write_split(folder / "data" / "train-00001-of-00002.parquet", "train", 200)
    write_split(folder / "data" / "test-00000-of-00001.parquet", "test", 4)
    (folder / "README.md").write_text("# card")


def plain_hub(folder: Path) -> Hub:
    """A stand-in hub holding `plain_repo` as org/plain at main."""
    hub = Hub()
    plain_repo(folder)
    hub.add("org/plain", "main", folder)
    return hub


PIPELINE = """
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


def script_repo(folder: Path) -> Path:
    """A main commit with a loading script and no data files: its splits are the hub's
    converted Parquet."""
    folder.mkdir()
    (folder / "README.md").write_text("# a dataset with a loading script")
    (folder / "builder.py").write_text("# builder")
    return folder


def download_patterns(
    endpoint: str, cache: Path, repo: str, patterns: list[str], revision: str = "main"
) -> None:
    """`snapshot_download` of `patterns` only, as `hf download --include` does: the hub cache
    then holds the repository's file listing and part of its files."""
    code = (
        "import sys; from huggingface_hub import snapshot_download; "
        "snapshot_download(sys.argv[1], repo_type='dataset', revision=sys.argv[2], "
        "allow_patterns=sys.argv[3:])"
    )
    _client(endpoint, cache, code, [repo, revision, *patterns])


def download_files(endpoint: str, cache: Path, repo: str, files: list[str]) -> None:
    """`hf_hub_download` of each of `files`: the hub cache holds them, and no listing."""
    code = (
        "import sys; from huggingface_hub import hf_hub_download\n"
        "for name in sys.argv[2:]:\n"
        "    hf_hub_download(sys.argv[1], name, repo_type='dataset')"
    )
    _client(endpoint, cache, code, [repo, *files])


def _client(endpoint: str, cache: Path, code: str, args: list[str]) -> None:
    """Runs `code` (with `args`) in a fresh interpreter whose huggingface_hub asks the hub at
    `endpoint` and downloads into `cache`."""
    env = {**os.environ, "HF_ENDPOINT": endpoint, "HF_HUB_CACHE": str(cache)}
    env.pop("HF_HUB_OFFLINE", None)
    subprocess.run([sys.executable, "-c", code, *args], env=env, check=True, timeout=60)


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


def read_tokens(url: str, tmp_path: Path, **env: str) -> dict[str, Any]:
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


def token_file(path: Path, documents: list[list[int]]) -> None:
    """A 1-D `.npy` token file and its `.offsets.npy` beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    np.save(path, np.array([t for document in documents for t in document], dtype=np.int32))
    offsets = np.cumsum([0] + [len(document) for document in documents])
    np.save(path.with_name(path.name[: -len(".npy")] + ".offsets.npy"), offsets)


_OPEN = """
import sys
from zephon_torch.io import Dataset
dataset = Dataset.from_path("hf", sys.argv[1], format=sys.argv[2] or None)
print(dataset.format, [shard.num_rows for shard in dataset.shards])
"""


def open_hf(url: str, format_: str | None, tmp_path: Path, **env: str) -> str:
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
