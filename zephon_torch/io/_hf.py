"""`hf://org/name[@revision][/config]/split`: a Hugging Face hub dataset's data files, via
huggingface_hub. The commit read goes into the dataset's fingerprint; `@revision` (a commit,
branch or tag) pins it, so that a run resumes on the commit it started with.

Online, the split's files are listed through the hub's fsspec file system (`HfFileSystem`) and
read like any remote URL (`list_hf`): downloaded shard by shard, as readers reach them, into the
node-local shard cache (LRU under `max_bytes`, prefetched ahead), with Parquet row counts from
footers read by range, all from the commit the revision pointed at when the dataset was opened.
Offline (`HF_HUB_OFFLINE=1`), or when no answer comes from the hub, the split's files come from
the local hub cache (`resolve_hf`, nothing downloaded) and are read as local files.

A split's files are found by these rules (the hub's own rules, narrowed: no split synonyms such
as `dev` or `valid`, and no reading of every file as `train` when no name says a split; such
repositories need a card's `configs:`, else they are read from the converted Parquet):

- where the dataset card (`README.md`) lists `configs:`, the files its config (the one named,
  else the one marked `default`, else "default", else the only one) gives the split in
  `data_files` (glob patterns: `*` within a folder, `**` across folders), relative to its
  `data_dir` where it has one; a config with a `data_dir` and no `data_files` has the split's
  files under `data_dir` found by name, as below;
- else those under `{config}/` (when a config is named) whose path has a folder named `split`,
  or whose file name is the split's name followed by a file extension, or by `-` or `_` and a
  digit (`train-00000-of-00004.parquet`; not `train_sft-...` or `train.100-...`, other splits).

When the main revision has none, the hub's auto-converted Parquet (`refs/convert/parquet`:
`{config}/{split}/*.parquet`; with no config named, "default", else the only config there) is
used; a `partial-{split}` folder there holds only a prefix of a large split, and is read with a
warning saying so. Read from the hub cache, a split with a file missing (a numbered shard
`-00001-of-00004`, or a converted file the cached listing names) is an error naming it: the
cache holds only part of the split. A split not found is an error naming the configs or splits
there are, where the card or the converted layout says.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
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
    """Splits `hf://org/name[@revision][/config]/split` into (repo id, config or None, split);
    see `pinned_revision` for the revision."""
    parts = [part for part in url[len("hf://") :].split("/") if part]
    if len(parts) not in (3, 4):
        raise ConfigError(
            f"`path` must look like hf://org/name/split or hf://org/name/config/split, got {url!r}"
        )
    repo = f"{parts[0]}/{parts[1].split('@', 1)[0]}"
    config = parts[2] if len(parts) == 4 else None
    return repo, config, parts[-1]


def pinned_revision(url: str) -> str | None:
    """The revision of `hf://org/name@revision/...` (a commit, branch or tag), else None."""
    parts = [part for part in url[len("hf://") :].split("/") if part]
    if len(parts) < 2 or "@" not in parts[1]:
        return None
    revision = parts[1].split("@", 1)[1]
    if not revision:
        raise ConfigError(f"{url!r} has an empty revision after '@'")
    return revision


def _revisions(url: str, config: str | None) -> list[tuple[str | None, str | None, bool]]:
    """Where to look, in order: (revision, config named or None, whether it is the
    auto-converted Parquet layout): main (or the pinned revision) as uploaded, then the
    converted layout (`refs/convert/parquet`, or the pinned revision, which may be one of its
    commits)."""
    pinned = pinned_revision(url)
    converted = CONVERTED_REVISION if pinned is None else pinned
    return [(pinned, config, False), (converted, config, True)]


def split_files(
    files: Sequence[str],
    config: str | None,
    split: str,
    configs: Sequence[dict[str, Any]] = (),
) -> list[str]:
    """The data files (repo-relative paths) of a split, sorted; see the module docstring.
    `configs`: the dataset card's (`card_configs`), which decide where it has them."""
    if not configs:
        return _by_name(files, config, split)
    chosen = _card_config(configs, config)
    data_dir = str(chosen.get("data_dir") or "").strip("/")
    if chosen.get("data_files") is None:  # the split found by name, under data_dir
        return _by_name(files, data_dir or None, split)
    patterns = _card_patterns(chosen, split, data_dir)
    return sorted(
        file
        for file in files
        if detect_format(file) is not None and any(p.match(file) for p in patterns)
    )


def find_split(
    files: Sequence[str],
    config: str | None,
    split: str,
    configs: Sequence[dict[str, Any]] = (),
    *,
    converted: bool = False,
) -> tuple[list[str], str]:
    """The split's files (`split_files`, or in the auto-converted layout when `converted`),
    and when there are none, why: the configs or splits the revision has instead."""
    if converted:
        return _converted_split(files, config, split)
    found = split_files(files, config, split, configs)
    why = f"no files of split {split!r}"
    if not found and configs:
        chosen = _card_config(configs, config)
        if chosen.get("data_files") is not None:
            name = chosen.get("config_name", "default")
            why += f"; the card's config {name!r} has splits {_card_splits(chosen)}"
    return found, why


def _converted_split(files: Sequence[str], config: str | None, split: str) -> tuple[list[str], str]:
    """The split's files in the auto-converted layout (`{config}/{split}/*.parquet`, or
    `{config}/partial-{split}/`): with no config named, "default", else the only one."""
    folders = sorted({f.split("/", 1)[0] for f in files if "/" in f and detect_format(f)})
    if config is None:
        if len(folders) > 1 and "default" not in folders:
            return [], f"configs {folders}: name one, hf://org/name/CONFIG/split"
        config = folders[0] if len(folders) == 1 else "default"
    found = _by_name(files, config, split)
    if found:
        return found, ""
    if config not in folders:
        return [], f"no config {config!r} (configs: {folders})"
    splits = sorted(
        {
            f.split("/")[1].removeprefix("partial-")
            for f in files
            if f.startswith(f"{config}/") and f.count("/") >= 2 and detect_format(f)
        }
    )
    return [], f"no split {split!r} in config {config!r} (splits: {splits})"


def _card_splits(chosen: dict[str, Any]) -> list[str]:
    """The splits a card's config names in its `data_files`."""
    data_files = chosen.get("data_files")
    if isinstance(data_files, dict):
        return sorted(str(key) for key in data_files)
    if isinstance(data_files, list) and data_files and isinstance(data_files[0], dict):
        return sorted({str(e.get("split", "train")) for e in data_files if isinstance(e, dict)})
    return ["train"]


def _by_name(files: Sequence[str], folder: str | None, split: str) -> list[str]:
    """The files of `split` by their names (under `folder`): see the module docstring."""
    pattern = re.compile(rf"^{re.escape(split)}([-_][0-9]|\.[A-Za-z][^/]*$|$)")
    prefix = [] if folder is None else folder.split("/")
    chosen = []
    for file in files:
        parts = file.split("/")
        if parts[: len(prefix)] != prefix:
            continue
        parts = parts[len(prefix) :]
        if detect_format(file) is None or any(p.startswith((".", "_")) for p in parts):
            continue
        folders, name = parts[:-1], parts[-1]
        if split in folders or f"partial-{split}" in folders or pattern.match(name):
            chosen.append(file)
    return sorted(chosen)


def card_configs(card: str | None) -> list[dict[str, Any]]:
    """The `configs:` of a dataset card's YAML header ([] when it has none)."""
    if not card or not card.startswith("---"):
        return []
    end = card.find("\n---", 3)
    if end < 0:
        return []
    import yaml  # type: ignore[import-untyped]  # huggingface_hub depends on it

    try:
        header = yaml.safe_load(card[3:end])
    except yaml.YAMLError as error:
        raise ConfigError(f"the dataset card's YAML header does not parse: {error}") from None
    configs = header.get("configs") if isinstance(header, dict) else None
    return [c for c in configs if isinstance(c, dict)] if isinstance(configs, list) else []


def _card_config(configs: Sequence[dict[str, Any]], config: str | None) -> dict[str, Any]:
    """The card's config named `config`, else the one marked default, else "default", else the
    only one."""
    names = [str(c.get("config_name", "default")) for c in configs]
    if config is not None:
        if config not in names:
            raise ConfigError(f"the dataset card has no config {config!r}; it has {names}")
        return configs[names.index(config)]
    marked = [c for c in configs if c.get("default") is True]
    if marked:
        return marked[0]
    if "default" in names:
        return configs[names.index("default")]
    if len(configs) == 1:
        return configs[0]
    raise ConfigError(f"the dataset has configs {names}: name one, hf://org/name/CONFIG/split")


def _card_patterns(chosen: dict[str, Any], split: str, data_dir: str) -> list[re.Pattern[str]]:
    """The path patterns a card's config gives `split` ([] for a split it does not have),
    relative to its `data_dir` where it has one."""
    data_files = chosen.get("data_files")
    if isinstance(data_files, (str, list)) and not (
        isinstance(data_files, list) and data_files and isinstance(data_files[0], dict)
    ):
        data_files = [{"split": "train", "path": data_files}]
    if isinstance(data_files, dict):
        data_files = [{"split": key, "path": value} for key, value in data_files.items()]
    paths: list[str] = []
    for entry in data_files if isinstance(data_files, list) else []:
        if isinstance(entry, dict) and entry.get("split", "train") == split:
            value = entry.get("path")
            paths += [value] if isinstance(value, str) else [str(v) for v in value or []]
    return [_glob(f"{data_dir}/{path}" if data_dir else path) for path in paths]


def _glob(pattern: str) -> re.Pattern[str]:
    """A data_files glob as a regex over repo-relative paths (`**` crosses folders; `[...]`
    and `[!...]` are character classes, as the hub's fsspec glob reads them)."""
    out = []
    for part in re.split(r"(\*\*/|\*\*|\*|\?|\[!?[^\]/]+\])", pattern.removeprefix("./")):
        if part.startswith("[") and part.endswith("]") and len(part) > 2:
            negated = part.startswith("[!")
            members = part[2:-1] if negated else part[1:-1]
            escaped = members.replace("\\", "\\\\").replace("^", "\\^")
            out.append(f"[^/{escaped}]" if negated else f"[{escaped}]")
            continue
        out.append(
            {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(part, re.escape(part))
        )
    return re.compile("".join(out) + "$")


def warn_if_partial(url: str, files: Sequence[str], split: str) -> None:
    """Warn when the split's files are the hub's partial conversion (a prefix of the split)."""
    if any(f"partial-{split}" in file.split("/") for file in files):
        warnings.warn(
            f"{url!r} reads the hub's auto-converted Parquet `partial-{split}`: only the first "
            "part of a large split (the hub converts a prefix). Its uploaded files were not "
            "matched to the split; a dataset card listing them under `configs:` fixes that.",
            stacklevel=3,
        )


def check_complete(url: str, files: Sequence[str]) -> None:
    """ConfigError when numbered shards (`name-00001-of-00004.ext`) of the split are missing:
    the hub cache holds only part of it."""
    groups: dict[tuple[str, str, str], set[int]] = {}
    for file in files:
        found = _NUMBERED.match(file)
        if found is not None:
            key = (found["stem"], found["total"], found["extension"] or "")
            groups.setdefault(key, set()).add(int(found["index"]))
    for (stem, total, extension), held in groups.items():
        missing = sorted(set(range(int(total))) - held)
        if missing:
            width = len(total)
            names = [f"{stem}-{i:0{width}d}-of-{total}*{extension}" for i in missing[:3]]
            raise ConfigError(
                f"the hub cache holds {len(held)} of the {int(total)} shards of {url!r}; "
                f"missing {names}{' ...' if len(missing) > 3 else ''}: download the split "
                "(online, or `huggingface-cli download`) before reading it offline"
            )


# `train-00000-of-00002.parquet`, or with a suffix of its own (`...-of-00002-1a2b3c.parquet`)
_NUMBERED = re.compile(
    r"^(?P<stem>.*)-(?P<index>[0-9]+)-of-(?P<total>[0-9]+)(?:-[0-9A-Za-z]+)?"
    r"(?P<extension>\.[^/]*)?$"
)


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
    for revision, configs, converted in _revisions(url, config):
        where = f"hf://datasets/{repo}@{revision or 'main'}"
        try:
            sha: str = call_with_retry(
                partial(_commit, api, repo, revision),
                url=where,
                policy=retry,
                what="resolving",
            )
            root = f"datasets/{repo}@{sha}"
            in_card = [] if converted else card_configs(_card(fs, root, where, once))
            # a card's data_files may lie anywhere in the repo; else under the config folder
            under = f"{root}/{configs}" if configs and not in_card and not converted else root
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
        files, why = find_split(list(paths), configs, split, in_card, converted=converted)
        if files:
            warn_if_partial(url, files, split)
            detected, chosen = format_, [paths[file] for file in files]
            if detected is None:
                detected, chosen = detect_files(url, "glob", chosen)
            objects = [(path, _hub_object(fs, path, found[path], repo, root)) for path in chosen]
            return fs.unstrip_protocol(root), Listing(detected, objects, fs=fs)
        tried.append(f"{revision or 'main'}: {why}")
    raise ConfigError(f"no files found at {url!r}: {'; '.join(tried)}")


def _card(fs: Any, root: str, where: str, policy: RetryPolicy) -> str | None:
    """The dataset card's text at the commit `root`, or None when it has none."""
    try:
        data: bytes = call_with_retry(
            partial(fs.cat_file, f"{root}/README.md"), url=where, policy=policy, what="reading"
        )
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


def resolve_hf(url: str) -> tuple[str, list[str], str]:
    """Finds the files of an `hf://` split in the local hub cache (nothing is downloaded).

    Returns:
        "glob", the local paths of the split's files, sorted, and the commit they are of.

    Raises:
        ImportError: when huggingface_hub is not installed.
        ConfigError: for a bad URL, or a split with no data files in either revision's
            cached snapshot.
    """
    snapshot_download = _hub().snapshot_download
    repo, config, split = parse_hf_url(url)
    tried = []
    for revision, configs, converted in _revisions(url, config):
        # The snapshot folder, asking only for the card (the converted layout has none, and its
        # split's files are checked once found): where the hub's file listing is cached,
        # huggingface_hub calls a snapshot incomplete when a listed file matching the patterns
        # is missing, and only the split's own files are to be checked, not the other splits'
        # (`*train*` matches `train_sft-*`) or configs'.
        patterns = [] if converted else ["README.md"]
        try:
            folder = snapshot_download(
                repo,
                repo_type="dataset",
                revision=revision,
                allow_patterns=patterns,
                local_files_only=True,
            )
        except Exception as error:  # not cached
            if not converted and type(error).__name__ == "IncompleteSnapshotError":
                # the repository has a card, which decides the splits, and it is not cached
                raise ConfigError(
                    f"{url!r}: the hub cache holds {repo!r} without its dataset card "
                    f"README.md, which says which files make up each split; download it too "
                    f"(hf download {repo} README.md --repo-type dataset): {error}"
                ) from error
            tried.append(f"{revision or 'main'}: {type(error).__name__}: {error}")
            continue
        readme = os.path.join(folder, "README.md")
        in_card = []
        if not converted and os.path.isfile(readme):
            with open(readme, encoding="utf-8", errors="replace") as f:
                in_card = card_configs(f.read())
        files, why = find_split(_listing(folder), configs, split, in_card, converted=converted)
        if files:
            check_complete(url, files)
            if converted:
                _check_converted_complete(url, repo, revision, files[0].split("/", 1)[0], split)
            warn_if_partial(url, files, split)
            commit = os.path.basename(os.path.normpath(folder))  # snapshots/<commit>
            return "glob", [os.path.join(folder, file) for file in files], commit
        tried.append(f"{revision or 'main'}: {why}")
    raise ConfigError(f"no files found at {url!r} in the hub cache: {'; '.join(tried)}")


def _check_converted_complete(
    url: str, repo: str, revision: str | None, config: str, split: str
) -> None:
    """ConfigError when the hub's cached listing of the converted revision has files of the
    split that the cache does not hold (their names are not numbered `-of-`)."""
    try:
        _hub().snapshot_download(
            repo,
            repo_type="dataset",
            revision=revision,
            allow_patterns=[f"{config}/{split}/*", f"{config}/partial-{split}/*"],
            local_files_only=True,
        )
    except Exception as error:
        if type(error).__name__ != "IncompleteSnapshotError":
            raise
        raise ConfigError(
            f"the hub cache holds only part of {url!r}: download the split (online, or `hf "
            f"download {repo} --repo-type dataset --revision {revision} --include "
            f"'{config}/*{split}/*'`) before reading it offline: {error}"
        ) from error


def _listing(folder: str) -> list[str]:
    found = []
    for root, _, names in os.walk(folder):
        for name in names:
            found.append(os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/"))
    return found
