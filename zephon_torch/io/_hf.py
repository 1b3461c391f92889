"""`hf://org/name[/config]/split`: a Hugging Face hub dataset's data files, via huggingface_hub.

The repo's files are fetched with `snapshot_download` (so the local hub cache and
`HF_HUB_OFFLINE=1` are honoured) and read as local files. The split's files are those under
`{config}/` (when a config is named) whose path has a folder named `split` or a file name
starting with `split` followed by `-`, `_` or `.`. When the main revision has none, the hub's
auto-converted Parquet (`refs/convert/parquet`: `{config}/{split}/*.parquet` or
`{config}/partial-{split}/*.parquet`, config "default" when none is named) is used.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from zephon_torch.errors import ConfigError
from zephon_torch.io.formats import detect_format

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


def resolve_hf(url: str) -> tuple[str, list[str]]:
    """Fetches (or finds in the hub cache) the files of an `hf://` split.

    Returns:
        "glob" and the local paths of the split's files, sorted.

    Raises:
        ImportError: when huggingface_hub is not installed.
        ConfigError: for a bad URL, or a split with no data files in either revision.
    """
    try:
        from huggingface_hub import snapshot_download
    except ImportError as error:
        raise ImportError(
            "hf:// paths need huggingface_hub: pip install 'zephon-torch[hf]'"
        ) from error
    repo, config, split = parse_hf_url(url)
    tried = []
    for revision, configs in ((None, config), (CONVERTED_REVISION, config or "default")):
        # fnmatch's `*` crosses folders: a superset of the split's files, refined below.
        patterns = [f"{configs}/*{split}*"] if configs else [f"*{split}*"]
        try:
            folder = snapshot_download(
                repo, repo_type="dataset", revision=revision, allow_patterns=patterns
            )
        except Exception as error:  # offline and not cached, missing revision, ...
            tried.append(f"{revision or 'main'}: {type(error).__name__}: {error}")
            continue
        files = split_files(_listing(folder), configs, split)
        if files:
            return "glob", [os.path.join(folder, file) for file in files]
        tried.append(f"{revision or 'main'}: no files of split {split!r}")
    raise ConfigError(f"no files found at {url!r}: {'; '.join(tried)}")


def _listing(folder: str) -> list[str]:
    found = []
    for root, _, names in os.walk(folder):
        for name in names:
            found.append(os.path.relpath(os.path.join(root, name), folder).replace(os.sep, "/"))
    return found
