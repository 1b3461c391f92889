"""`hf://org/name[/config]/split`: a Hugging Face hub dataset's data files, via huggingface_hub.

Online, the split's files are listed through the hub's fsspec file system (`HfFileSystem`) and
read like any remote URL (`list_hf`): downloaded shard by shard, as readers reach them, into the
node-local shard cache (LRU under `max_bytes`, prefetched ahead), with Parquet row counts from
footers read by range, all from the commit the revision pointed at when the dataset was opened.
Offline (`HF_HUB_OFFLINE=1`), or when no answer comes from the hub, the split's files come from
the local hub cache (`resolve_hf`, nothing downloaded) and are read as local files.

The split's files are those under `{config}/` (when a config is named) whose path has a folder
named `split` or a file name starting with `split` followed by `-`, `_` or `.`. When the main
revision has none, the hub's auto-converted Parquet (`refs/convert/parquet`:
`{config}/{split}/*.parquet` or `{config}/partial-{split}/*.parquet`, config "default" when none
is named) is used.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from zephon_torch.errors import ConfigError, StorageError, ZephonError
from zephon_torch.io._discover import detect_files
from zephon_torch.io._remote import Listing, identity
from zephon_torch.io._retry import RetryPolicy, call_with_retry, http_status, is_transient
from zephon_torch.io._shard_cache import CachedObject
from zephon_torch.io.formats import detect_format

_log = logging.getLogger(__name__)

CONVERTED_REVISION = "refs/convert/parquet"


def parse_hf_url(url: str) -> tuple[str, str | None, str]:
    """Splits `hf://org/name[/config]/split` into (repo id, config or None, split)."""
    parts = [part for part in url[len("hf://") :].split("/") if part]
    if len(parts) not in (3, 4):
        raise ConfigError(
            f"`path` must look like hf://org/name/split or hf://org/name/config/split, got {url!r}"
        )
    repo = f"{parts[0]}/{parts[1]}"
    config = parts[2] if len(parts) == 4 else None
    return repo, config, parts[-1]


def split_files(files: Sequence[str], config: str | None, split: str) -> list[str]:
    """The data files (repo-relative paths) of a split, sorted; see the module docstring."""
    pattern = re.compile(rf"^{re.escape(split)}([-_.]|$)")
    chosen = []
    for file in files:
        parts = file.split("/")
        if config is not None:
            if parts[0] != config:
                continue
            parts = parts[1:]
        if detect_format(file) is None or any(p.startswith((".", "_")) for p in parts):
            continue
        folders, name = parts[:-1], parts[-1]
        if split in folders or f"partial-{split}" in folders or pattern.match(name):
            chosen.append(file)
    return sorted(chosen)


def _hub() -> Any:
    try:
        import huggingface_hub
    except ImportError as error:
        raise ImportError(
            "hf:// paths need huggingface_hub: pip install 'zephon-torch[hf]'"
        ) from error
    return huggingface_hub


def list_hf(
    url: str,
    *,
    format_: str | None,
    storage_options: Mapping[str, Any],
    retry: RetryPolicy,
) -> tuple[str, Listing] | None:
    """Lists an `hf://` split on the hub, downloading nothing: the root URL of the commit it
    reads on the hub's file system (`hf://datasets/org/name@sha`) and its files there, as
    remote objects. The revision (main, else `refs/convert/parquet`) is resolved to its commit
    once: shards are read from that commit however the branch moves during the run.

    Returns:
        None when huggingface_hub is offline (`HF_HUB_OFFLINE=1`), or when no answer came from
        the hub after the retries (a warning says so): then read the hub cache (`resolve_hf`).

    Raises:
        ImportError: when huggingface_hub is not installed.
        ConfigError: for a bad URL or repo id, a repo that does not exist or is not open to
            this token (the hub's 4xx answer), or a split with no data files in either revision.
        StorageError: when the hub kept answering with errors (429, 5xx).
    """
    hub = _hub()
    repo, config, split = parse_hf_url(url)
    from huggingface_hub import constants
    from huggingface_hub.errors import HFValidationError, RevisionNotFoundError
    from huggingface_hub.utils._validators import validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError as error:
        raise ConfigError(f"{url!r} does not name a hub repo: {error}") from None
    if constants.HF_HUB_OFFLINE:
        return None
    fs = hub.HfFileSystem(**storage_options)
    api = hub.HfApi(endpoint=fs.endpoint, token=fs.token)
    once = replace(retry, attempts=1)
    tried = []
    for revision, configs in ((None, config), (CONVERTED_REVISION, config or "default")):
        where = f"hf://datasets/{repo}@{revision or 'main'}"
        try:
            sha: str = call_with_retry(
                partial(_commit, api, repo, revision),
                url=where,
                policy=retry,
                what="resolving",
            )
            root = f"datasets/{repo}@{sha}"
            under = f"{root}/{configs}" if configs else root
            found: dict[str, dict[str, Any]] = call_with_retry(  # the tree retries itself
                partial(fs.find, under, detail=True), url=where, policy=once, what="listing"
            )
        except RevisionNotFoundError:
            tried.append(f"{revision or 'main'}: no such revision")
            continue
        except FileNotFoundError:  # the config folder
            tried.append(f"{revision or 'main'}: no folder {configs!r}")
            continue
        except (_NoAnswer, StorageError) as error:
            cause = error.__cause__ or error
            if http_status(cause) is not None:
                raise  # the hub answered, with errors
            _log.warning("the hub cannot be reached for %s (%s): reading the hub cache", url, cause)
            return None
        except OSError as error:  # the hub's 4xx answers: no such repo, gated, denied
            if http_status(error) is None:
                raise
            raise ConfigError(f"cannot read {url!r} from the hub: {error}") from error
        paths = {
            path[len(root) + 1 :]: path for path, info in found.items() if info["type"] == "file"
        }
        files = split_files(list(paths), configs, split)
        if files:
            detected, chosen = format_, [paths[file] for file in files]
            if detected is None:
                detected, chosen = detect_files(url, "glob", chosen)
            objects = [(path, _hub_object(fs, path, found[path], repo, root)) for path in chosen]
            return fs.unstrip_protocol(root), Listing(detected, objects, fs=fs)
        tried.append(f"{revision or 'main'}: no files of split {split!r}")
    raise ConfigError(f"no files found at {url!r}: {'; '.join(tried)}")


def _hub_object(fs: Any, path: str, info: Mapping[str, Any], repo: str, root: str) -> CachedObject:
    """A hub file at a commit, keyed in the caches by its path without the commit when the hub
    gave its blob id (content-addressed): commits that leave it unchanged reuse its download
    and its remembered row count."""
    item = identity(fs.unstrip_protocol(path), info)
    if not item.version:
        return item
    return replace(item, key=f"hf://datasets/{repo}/{path[len(root) + 1 :]}")


class _NoAnswer(ZephonError):
    """No answer came from the hub (refused, timed out): read its cache now, not after the
    retries' waits."""


def _commit(api: Any, repo: str, revision: str | None) -> str:
    """The commit a revision of a dataset repo points at now. Its request has no backoff of
    its own: the hub's 429 and 5xx answers are retried by the caller's policy.

    Raises:
        _NoAnswer: when no answer came.
    """
    try:
        sha: str = api.dataset_info(repo, revision=revision).sha
    except Exception as error:
        no_answer = http_status(error) is None and is_transient(error)
        if no_answer and not isinstance(error, ValueError):  # refused, timed out, reset
            raise _NoAnswer(str(error)) from error
        raise
    return sha


def resolve_hf(url: str) -> tuple[str, list[str]]:
    """Finds the files of an `hf://` split in the local hub cache (nothing is downloaded).

    Returns:
        "glob" and the local paths of the split's files, sorted.

    Raises:
        ImportError: when huggingface_hub is not installed.
        ConfigError: for a bad URL, or a split with no data files in either revision's
            cached snapshot.
    """
    snapshot_download = _hub().snapshot_download
    repo, config, split = parse_hf_url(url)
    tried = []
    for revision, configs in ((None, config), (CONVERTED_REVISION, config or "default")):
        # fnmatch's `*` crosses folders: a superset of the split's files, refined below.
        patterns = [f"{configs}/*{split}*"] if configs else [f"*{split}*"]
        try:
            folder = snapshot_download(
                repo,
                repo_type="dataset",
                revision=revision,
                allow_patterns=patterns,
                local_files_only=True,
            )
        except Exception as error:  # not cached
            tried.append(f"{revision or 'main'}: {type(error).__name__}: {error}")
            continue
        files = split_files(_listing(folder), configs, split)
        if files:
            return "glob", [os.path.join(folder, file) for file in files]
        tried.append(f"{revision or 'main'}: no files of split {split!r}")
    raise ConfigError(f"no files found at {url!r} in the hub cache: {'; '.join(tried)}")


def _listing(folder: str) -> list[str]:
    found = []
    for root, _, names in os.walk(folder):
        for name in names:
            found.append(os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/"))
    return found
