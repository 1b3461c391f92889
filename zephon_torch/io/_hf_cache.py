"""`hf://` offline: a split's files found in the local hub cache (`HF_HUB_OFFLINE=1`, or no
answer from the hub), nothing downloaded, checked against the listing of the whole commit that
huggingface_hub keeps with its downloads (a split cached in part is an error naming what is
missing). huggingface_hub keeps that listing from 1.23; with an older one (transformers 4.x
requires one before 1.0) the hub cache is not read: a split cached in part, or without its card,
would read as other files than online. Which files make up a split: see `_hf_splits`; reading
from the hub: `_hf`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from zephon_torch._caller import warn
from zephon_torch.errors import ConfigError
from zephon_torch.io._hf import SLASH_NOTE, hub
from zephon_torch.io._hf_card import card_configs
from zephon_torch.io._hf_splits import (
    CONVERTED_REVISION,
    check_complete,
    find_split,
    parse_hf_url,
    pinned_layout,
    pinned_revision,
    refuse_indexed,
    revisions,
    unnumbered,
    warn_if_partial,
)


def resolve_hf(url: str, format_: str | None = None) -> tuple[str, list[str], str]:
    """Finds the files of an `hf://` split in the local hub cache (nothing is downloaded), to
    be read as `format_` (None: detected).

    Returns:
        "glob", the local paths of the split's files, sorted, and the commit they are of.

    Raises:
        ImportError: when huggingface_hub is not installed.
        ConfigError: for a bad URL, a split with no data files in either revision's cached
            snapshot, or a huggingface_hub that keeps no listing of cached commits.
    """
    module = hub()
    if not hasattr(module, "get_cached_repo_tree"):
        raise ConfigError(
            f"{url!r}: reading hf:// from the local hub cache (offline, or with the hub not "
            f"answering) needs huggingface_hub 1.23 or newer, which keeps the listing of each "
            f"cached commit: without it, a split cached in part or without its dataset card "
            f"would read as other files than online. huggingface_hub {module.__version__} is "
            f"installed (transformers 4.x requires one before 1.0): read the split online, or "
            f"download its files and read them by their local path"
        )
    snapshot_download = module.snapshot_download
    repo, config, split = parse_hf_url(url)
    tried = []
    refs = _cached_refs(repo)
    for revision, configs, converted in revisions(url, config):
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
            tried.append(_not_held(url, repo, revision, converted, error))
            continue
        commit = os.path.basename(os.path.normpath(folder))  # snapshots/<commit>
        # offline, a pinned commit's layout is known where a cached ref names it
        named = [name for name, sha in refs.items() if sha == commit]
        if named and not pinned_layout(
            url, commit, lambda: {refs.get(CONVERTED_REVISION, "")}, converted=converted
        ):
            continue
        readme = os.path.join(folder, "README.md")
        if not converted:
            _check_card_blob(url, repo, commit, readme)
        in_card = []
        if not converted and os.path.isfile(readme):
            with open(readme, encoding="utf-8", errors="replace") as f:
                in_card = card_configs(f.read(), where=readme)
        listing = _listing(folder)
        files, why = find_split(listing, configs, split, in_card, converted=converted)
        if not files and not converted:  # none cached: the commit may have them all the same
            _check_none_held(url, repo, commit, (configs, split, in_card))
        if files:
            refuse_indexed(url, files, listing, format_)
            if not (named or converted or os.path.isfile(readme)):  # a pinned commit, or main
                _check_one_reading(url, commit, listing, configs, split, files)
            # the commit's cached listing says what the split holds, else shard numbers do (a
            # commit may lack a numbered shard: read online and by a local path as it is)
            listed = _cached_tree(repo, commit)
            if listed is None:
                check_complete(url, files)
                _warn_unlisted(url, repo, commit, files, card=converted or os.path.isfile(readme))
            else:
                whole = find_split(listed, configs, split, in_card, converted=converted)
                _check_held(url, repo, commit, files, whole, _partners(whole[0], listing, listed))
            _check_blobs(url, repo, commit, folder, files)
            warn_if_partial(url, files, split)
            return "glob", [os.path.join(folder, file) for file in files], commit
        tried.append(f"{revision or 'main'}: {why}")
    from huggingface_hub import constants

    raise ConfigError(
        f"no files found at {url!r} in the hub cache {constants.HF_HUB_CACHE!r} (HF_HUB_CACHE, "
        f"else HF_HOME, sets where it lies): {'; '.join(tried)}"
    )


def _not_held(url: str, repo: str, revision: str | None, converted: bool, error: Exception) -> str:
    """What a look at a revision the hub cache does not hold found (for the final error), or a
    `ConfigError` at once: for a card it lacks, or a pinned revision it lacks."""
    if not converted and type(error).__name__ == "IncompleteSnapshotError":
        # the repository has a card, which decides the splits, and it is not cached
        raise ConfigError(
            f"{url!r}: the hub cache holds {repo!r} without its dataset card "
            f"README.md, which says which files make up each split; download it too "
            f"(hf download {repo} README.md --repo-type dataset): {error}"
        ) from error
    absent = _not_cached(error) or isinstance(error, IsADirectoryError)  # refs/a/b
    if absent and revision is not None and revision == pinned_revision(url):
        raise ConfigError(
            f"{url!r}: the hub cache holds no revision {revision!r} of {repo}: "
            f"{_cached_revisions(repo)}{SLASH_NOTE}"
        ) from error
    if absent:  # the hub's own text would advise `local_files_only=False`, no setting here
        return f"{revision or 'main'}: not in the hub cache ({type(error).__name__})"
    return f"{revision or 'main'}: {type(error).__name__}: {error}"


def _warn_unlisted(url: str, repo: str, commit: str, files: list[str], *, card: bool) -> None:
    """Warns where the hub cache keeps no listing of the commit (its files were downloaded one
    by one, or written by hand) and nothing else vouches for the split read from it: files
    without shard numbers, a part of which reads as the whole, or no dataset card, which, where
    the repository has one, may give the split other files (`card`: one is cached, or the
    converted layout, which has none, is read)."""
    loose = unnumbered(files)
    doubts = []
    if loose:
        doubts.append(
            f"that its {len(files)} cached file(s) are all of the split cannot be checked "
            f"({len(loose)} carry no shard number, e.g. {loose[0]!r})"
        )
    if not card:
        doubts.append(
            "no dataset card is cached, and where the repository has one its `configs:` may "
            "give the split other files"
        )
    if doubts:
        warn(
            f"{url!r}: the hub cache keeps no listing of commit {commit[:12]} (its files were "
            f"downloaded one by one), so {'; and '.join(doubts)}. A snapshot download keeps the "
            f"listing: hf download {repo} --repo-type dataset"
        )


def _check_one_reading(
    url: str, commit: str, listing: list[str], config: str | None, split: str, files: list[str]
) -> None:
    """ConfigError where a commit no cached ref names, without a card, reads the split as other
    files by the auto-converted Parquet's rules than by those of uploaded files: offline,
    which of the two it is cannot be told (online, the converted branch's history says)."""
    other, _ = find_split(listing, config, split, converted=True)
    if other and sorted(other) != sorted(files):
        raise ConfigError(
            f"{url!r}: offline, commit {commit[:12]} (no cached branch names it) may be of "
            "the hub's auto-converted Parquet or of uploaded files, and the two read split "
            f"{split!r} differently ({len(other)} files against {len(files)}): name the "
            "config, hf://org/name@COMMIT/CONFIG/split, or read it online"
        )


def _not_cached(error: Exception) -> bool:
    """Whether `snapshot_download(local_files_only=True)` failed for want of the revision."""
    from huggingface_hub.errors import LocalEntryNotFoundError

    return isinstance(error, LocalEntryNotFoundError)


def _cached_revisions(repo: str) -> str:
    """What the local hub cache holds of a dataset repo, for an error message: its named
    revisions (branches, tags, `refs/convert/parquet`) and the commits no name points at."""
    from huggingface_hub import constants

    named = _cached_refs(repo)
    snapshots = os.path.join(_cached_repo(repo), "snapshots")
    commits = sorted(os.listdir(snapshots)) if os.path.isdir(snapshots) else []
    if not named and not commits:
        return f"it holds nothing of it (in {constants.HF_HUB_CACHE})"
    held = [
        f"{name} (commit {sha[:12]}{'' if sha in commits else ', whose files it lacks'})"
        for name, sha in sorted(named.items())
    ]
    held += [sha for sha in commits if sha not in named.values()]
    return f"it holds {', '.join(held)}"


def _cached_tree(repo: str, commit: str) -> list[str] | None:
    """Every file of the commit, as the listing huggingface_hub keeps in its cache when it
    downloads (`get_cached_repo_tree`); None where it kept none (`hf_hub_download`'s of one
    file keeps none)."""
    try:
        tree = hub().get_cached_repo_tree(repo, repo_type="dataset", revision=commit)
    except Exception as error:  # none cached for this commit
        if type(error).__name__ != "CachedRepoTreeNotFoundError":
            raise
        return None
    return [str(entry.path) for entry in tree]


def _cached_repo(repo: str) -> str:
    """The hub cache's folder of a dataset repo."""
    from huggingface_hub import constants

    return os.path.join(constants.HF_HUB_CACHE, f"datasets--{repo.replace('/', '--')}")


def _cached_refs(repo: str) -> dict[str, str]:
    """The revisions the hub cache names for a dataset repo (branches, tags,
    `refs/convert/parquet`) and the commit each names."""
    refs = os.path.join(_cached_repo(repo), "refs")
    named: dict[str, str] = {}
    for where, _, names in os.walk(refs):
        for name in names:
            with open(os.path.join(where, name), encoding="utf-8") as f:
                named[os.path.relpath(os.path.join(where, name), refs)] = f.read().strip()
    return named


def _check_none_held(
    url: str, repo: str, commit: str, lookup: tuple[str | None, str, list[dict[str, Any]]]
) -> None:
    """ConfigError where the hub cache holds none of a split's uploaded files and the commit's
    cached listing gives it some (`lookup`: the config, split and card's configs): a cache
    holding the card alone (`hf download ... README.md`) and the converted Parquet read the
    converted split in the uploaded one's place, another commit and maybe a prefix, where
    online read the uploaded files."""
    listed = _cached_tree(repo, commit)
    if listed is not None:
        whole = find_split(listed, *lookup)
        if whole[0]:
            _check_held(url, repo, commit, [], whole)


def _check_blobs(url: str, repo: str, commit: str, folder: str, files: list[str]) -> None:
    """ConfigError naming the split's files (and the offsets files read beside its token
    files) whose links in the snapshot `folder` lead to no blob: the hub cache lost them (a
    blob deleted by hand, a cache copied without its `blobs/`), and each was read as a
    damaged shard, a JSONL one's error asking whether it changed since the open."""
    from zephon_torch.io.npy import unlisted_offsets

    wanted = [*files, *unlisted_offsets([file for file in files if file.endswith(".npy")])]
    lost = [file for file in wanted if _dangling(os.path.join(folder, file))]
    if lost:
        shown = ", ".join(lost[:3]) + (f" and {len(lost) - 3} more" if len(lost) > 3 else "")
        raise ConfigError(
            f"the hub cache holds only part of {url!r}: the links of {len(lost)} of its files "
            f"lead to no file in its blobs/ ({shown}); download them again (online, or `hf "
            f"download {repo} --repo-type dataset --revision {commit} --include ...` naming "
            "them) before reading it offline"
        )


def _check_card_blob(url: str, repo: str, commit: str, readme: str) -> None:
    """ConfigError where the snapshot's link to the dataset card leads to no blob. Where the
    cache keeps no listing of the commit (`hf_hub_download`'s downloads, older clients),
    huggingface_hub returns the snapshot all the same, and the split was found by file names,
    its card's `configs:` unread: other files than online, silently."""
    if _dangling(readme):
        raise ConfigError(
            f"the hub cache holds only part of {url!r}: the link of the dataset card README.md "
            f"of {repo} at commit {commit[:12]}, which says which files make up each split, "
            f"leads to no file in its blobs/; download it again (online, or `hf download {repo} "
            f"README.md --repo-type dataset --revision {commit}`) before reading it offline"
        )


def _dangling(path: str) -> bool:
    """Whether `path` is a link to nothing."""
    return os.path.islink(path) and not os.path.exists(path)


def _partners(files: list[str], cached: list[str], listed: list[str]) -> list[str]:
    """The offsets files of the `.npy` token files of a split (`files`, as the commit's cached
    listing gives it) that the commit holds beside them (`listed`: that listing) and the hub
    cache (`cached`) lacks: they are read beside the token files (online, by a local path, and
    from the cache), so the cache holds only part of the split."""
    from zephon_torch.io.npy import unlisted_offsets

    wanted = unlisted_offsets([file for file in files if file.endswith(".npy")])
    there, held = set(listed), set(cached)
    return [partner for partner in wanted if partner in there and partner not in held]


def _check_held(
    url: str,
    repo: str,
    commit: str,
    held: list[str],
    listed: tuple[list[str], str],
    lacking: Sequence[str] = (),
) -> None:
    """ConfigError when the split the commit's cached listing gives (`listed`: its files, or
    why there are none) is not the split found among the files the cache holds (`held`), or
    the cache lacks files read beside them (`lacking`: the offsets files of 1-D token files):
    the cache holds only part of it, and the part would be read as if it were the whole (or,
    for an offsets file, fail as a token file without its offsets)."""
    files, why = listed
    if not files:  # the whole listing decides otherwise (a config to name, say)
        raise ConfigError(
            f"{url!r}: the hub cache holds only part of {repo} at commit {commit[:12]}; "
            f"its cached listing of the whole commit says: {why}"
        )
    files = [*files, *lacking]
    missing = sorted(set(files) - set(held))
    if missing:
        shown = ", ".join(missing[:3]) + (
            f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        )
        raise ConfigError(
            f"the hub cache holds only part of {url!r}: {len(missing)} of its {len(files)} files "
            f"are missing ({shown}); download the split (online, or `hf download {repo} "
            f"--repo-type dataset --revision {commit} --include ...` naming them) before "
            "reading it offline"
        )


def _listing(folder: str) -> list[str]:
    found = []
    for root, _, names in os.walk(folder):
        for name in names:
            found.append(os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/"))
    return found
