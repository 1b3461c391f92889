"""`hf://org/name[@revision][/config]/split`: a Hugging Face hub dataset's data files, via
huggingface_hub. The commit read goes into the dataset's fingerprint; `@revision` (a commit,
branch or tag) pins it, so that a run resumes on the commit it started with.

Online, the split's files are listed through the hub's fsspec file system (`HfFileSystem`) and
read like any remote URL (`list_hf`): downloaded shard by shard, as readers reach them, into the
node-local shard cache (LRU under `max_bytes`, prefetched ahead), with Parquet row counts from
footers read by range, all from the commit the revision pointed at when the dataset was opened.
Offline (`HF_HUB_OFFLINE=1`), or when no answer comes from the hub, the split's files come from
the local hub cache (`_hf_cache.resolve_hf`, nothing downloaded) and are read as local files.

Which files make up a split: see `_hf_splits`.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import cache, partial
from typing import Any, TypeVar

from zephon_torch.errors import ConfigError, StorageError, ZephonError
from zephon_torch.io._discover import detect_files
from zephon_torch.io._hf_card import card_configs
from zephon_torch.io._hf_splits import (
    CONVERTED_REVISION,
    find_split,
    folders_note,
    parse_hf_url,
    pinned_layout,
    pinned_revision,
    refuse_indexed,
    revisions,
    warn_if_partial,
)
from zephon_torch.io._remote import Listing
from zephon_torch.io._retry import RetryPolicy, call_with_retry, http_status, is_transient
from zephon_torch.io._shard_cache import CachedObject
from zephon_torch.io._versions import identity

_log = logging.getLogger(__name__)
_T = TypeVar("_T")
SLASH_NOTE = " (a `/` in a revision's name is written %2F in the URL: @release%2Fv1)"


def hub() -> Any:
    try:
        import huggingface_hub
    except ImportError as error:
        raise ImportError(
            "hf:// paths need huggingface_hub: pip install 'zephon-torch[hf]'"
        ) from error
    return huggingface_hub


def backs_off_listings(version: str) -> bool:
    """Whether huggingface_hub at `version` retries a file listing's 429 and 5xx answers
    itself: from 2.1 (before, its listing's first page was asked once, and a hub answering
    one 429 there failed the open, the listing not retried here either)."""
    major, minor = (int(part) for part in re.findall(r"\d+", version)[:2])
    return (major, minor) >= (2, 1)


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
    module = hub()
    repo, config, split = parse_hf_url(url)
    from huggingface_hub import constants
    from huggingface_hub.errors import RevisionNotFoundError

    _check_repo_id(url, repo)
    if constants.HF_HUB_OFFLINE:
        return None
    fs = module.HfFileSystem(**storage_options)
    api = module.HfApi(endpoint=fs.endpoint, token=fs.token)
    # the listings' questions are retried by huggingface_hub's own backoff where it has one
    once = replace(retry, attempts=1) if backs_off_listings(module.__version__) else retry
    tried = []
    conversions = cache(  # asked for once, and only where a revision is pinned
        partial(
            call_with_retry,
            partial(_answered, partial(_conversions, api, repo), retry.timeout),
            url=url,
            policy=retry,
        )
    )
    for revision, configs, converted in revisions(url, config):
        where = f"hf://datasets/{repo}@{revision or 'main'}"
        try:
            sha: str = call_with_retry(
                partial(_commit, api, repo, revision),
                url=where,
                policy=retry,
                what="resolving",
            )
            if not pinned_layout(url, sha, conversions, converted=converted):
                continue
            root = f"datasets/{repo}@{sha}"
            card = None if converted else _card(fs, root, where, once)
            in_card = card_configs(card, where=f"{where}/README.md")
            # a card's data_files may lie anywhere in the repo; else under the config folder
            under = f"{root}/{configs}" if configs and not in_card and not converted else root
            found = _find(fs, under, root, where, once)
        except RevisionNotFoundError:
            if revision is not None and revision == pinned_revision(url):  # the user's
                raise ConfigError(
                    f"no revision {revision!r} in {repo}: {_refs(api, repo)}{SLASH_NOTE}"
                ) from None
            tried.append(f"{revision or 'main'}: no such revision")
            continue
        except FileNotFoundError:  # the config folder
            note = _folders(fs, root, where, once)
            tried.append(f"{revision or 'main'}: no config folder {configs!r}{note}")
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
        files, why = find_split(list(paths), configs, split, in_card, converted=converted)
        if files:
            refuse_indexed(url, files, list(paths), format_)
            warn_if_partial(url, files, split)
            chosen = [paths[file] for file in files]
            return fs.unstrip_protocol(root), _listing(fs, url, format_, chosen, found, repo, root)
        tried.append(f"{revision or 'main'}: {why}")
    raise ConfigError(f"no files found at {url!r}: {'; '.join(tried)}")


def _listing(
    fs: Any,
    url: str,
    format_: str | None,
    chosen: list[str],
    found: Mapping[str, Any],
    repo: str,
    root: str,
) -> Listing:
    """The listing of a split's files `chosen` at the commit `root` (`found`: its files),
    their format detected where `format_` is None."""
    detected = format_
    if detected is None:
        detected, chosen = detect_files(url, "glob", chosen)
    partners = _offsets_partners(chosen, found) if detected == "npy" else []
    objects = [(p, _hub_object(fs, p, found[p], repo, root)) for p in chosen + partners]
    companions = frozenset(map(fs.unstrip_protocol, partners))
    return Listing(detected, objects, fs=fs, companions=companions)


def _offsets_partners(chosen: list[str], found: Mapping[str, Any]) -> list[str]:
    """The offsets files of the 1-D `.npy` token files of a split that its files leave out
    (`train.npy`, a card's `data/?.npy`), where the commit holds them: read beside them, as a
    local path's reader (and the hub cache's) finds them; such a split was refused online for
    lacking them. Companions, not shards (see `Listing`)."""
    from zephon_torch.io.npy import unlisted_offsets

    return [p for p in unlisted_offsets(chosen) if found.get(p, {}).get("type") == "file"]


def _find(fs: Any, under: str, root: str, where: str, policy: RetryPolicy) -> dict[str, Any]:
    """The files under `under` at the commit `root`, with their details (the tree request
    retries itself). Raises FileNotFoundError for a folder the commit lacks (listed empty)."""
    listing = partial(_answered, partial(fs.find, under, detail=True), policy.timeout)
    found: dict[str, Any] = call_with_retry(listing, url=where, policy=policy, what="listing")
    if not found and under != root:
        raise FileNotFoundError(under)
    return found


def _folders(fs: Any, root: str, where: str, policy: RetryPolicy) -> str:
    """The commit's folders holding data files (`folders_note`), for the error of a config
    folder it lacks; nothing where they could not be listed (only words for a message)."""
    try:
        found = _find(fs, root, root, where, policy)
    except Exception:
        return ""
    return folders_note(
        [path[len(root) + 1 :] for path, info in found.items() if info["type"] == "file"]
    )


def _check_repo_id(url: str, repo: str) -> None:
    """ConfigError unless `repo` is a hub repo id."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils._validators import validate_repo_id

    try:
        validate_repo_id(repo)
    except HFValidationError as error:
        raise ConfigError(f"{url!r} does not name a hub repo: {error}") from None


def _refs(api: Any, repo: str) -> str:
    """The repo's branches and tags, for an error message (what the hub said, when it did
    not list them)."""
    try:
        refs = _answered(partial(api.list_repo_refs, repo, repo_type="dataset"), _REFS_S)
    except Exception as error:  # only words for a message
        return f"its branches could not be listed ({type(error).__name__}: {error})"
    branches = ", ".join(sorted(ref.name for ref in refs.branches)) or "none"
    tags = ", ".join(sorted(ref.name for ref in refs.tags)) or "none"
    return f"it has the branches {branches} and the tags {tags} (or name a commit)"


def _card(fs: Any, root: str, where: str, policy: RetryPolicy) -> str | None:
    """The dataset card's text at the commit `root`, or None when it has none."""
    try:
        reading = partial(_answered, partial(fs.cat_file, f"{root}/README.md"), policy.timeout)
        data: bytes = call_with_retry(reading, url=where, policy=policy, what="reading")
    except FileNotFoundError:
        return None
    return data.decode("utf-8", errors="replace")


def _hub_object(fs: Any, path: str, info: Mapping[str, Any], repo: str, root: str) -> CachedObject:
    """A hub file at a commit, keyed in the caches by its path without the commit when the hub
    gave its blob id (content-addressed): commits that leave it unchanged reuse its download
    and its remembered row count."""
    item = identity(fs.unstrip_protocol(path), info)
    if not item.version:
        return item
    return replace(item, key=f"hf://datasets/{repo}/{path[len(root) + 1 :]}")


def _conversions(api: Any, repo: str) -> set[str]:
    """Every commit the repo's auto-converted Parquet branch has had (none where it has no
    such branch)."""
    try:
        commits = api.list_repo_commits(repo, repo_type="dataset", revision=CONVERTED_REVISION)
    except Exception as error:
        if http_status(error) != 404:  # no such branch
            raise
        return set()
    return {str(commit.commit_id) for commit in commits}


class _NoAnswer(ZephonError):
    """No answer came from the hub (refused, timed out): read its cache now, not after the
    retries' waits."""


def _commit(api: Any, repo: str, revision: str | None) -> str:
    """The commit a revision of a dataset repo points at now. Its request has no backoff of
    its own: the hub's 429 and 5xx answers are retried by the caller's policy. It waits for
    an answer as long as huggingface_hub's own metadata requests (`HF_HUB_ETAG_TIMEOUT`, 10 s):
    its client has no timeout, and a hub that took the connection and never answered (a
    proxy, a stalled server) held the open for ever, the hub cache unread.

    Raises:
        _NoAnswer: when no answer came.
    """
    from huggingface_hub import constants

    try:
        timeout = constants.HF_HUB_ETAG_TIMEOUT
        sha: str = api.dataset_info(repo, revision=revision, timeout=timeout).sha
    except Exception as error:
        no_answer = http_status(error) is None and is_transient(error)
        if no_answer and not isinstance(error, ValueError):  # refused, timed out, reset
            raise _NoAnswer(str(error)) from error
        raise
    return sha


_REFS_S = 10.0  # the most an error message waits for the repo's branches


def _answered(call: Callable[[], _T], seconds: float) -> _T:
    """`call()` (a question to the hub), run on a thread of its own and waited for `seconds`.
    huggingface_hub's client waits for an answer without limit, and its listings take no
    timeout: a hub that answered the commit's request, then went silent, held the open for
    ever. The thread left waiting is a daemon, and ends with the process.

    Raises:
        _NoAnswer: when no answer came in `seconds`.
    """
    got: list[Any] = []

    def ask() -> None:
        try:
            got.append((True, call()))
        except BaseException as error:  # handed to the caller's thread
            got.append((False, error))

    thread = threading.Thread(target=ask, name="zephon-hub-question", daemon=True)
    thread.start()
    thread.join(seconds)
    if not got:
        raise _NoAnswer(f"no answer from the hub in {seconds:.0f} s")
    ok, value = got[0]
    if not ok:
        raise value
    return value  # type: ignore[no-any-return]
