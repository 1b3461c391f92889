"""Which files of a hub dataset repository make up an `hf://` split: pure functions of its
file list and dataset card, shared by the online listing and the hub-cache lookup (`_hf`). The
card's `configs:` are parsed and checked in `_hf_card`.

A split's files are found by these rules (the hub's own rules, narrowed: no split synonyms such
as `dev` or `valid`, and no reading of every file as `train` when no name says a split; such
repositories need a card's `configs:`, else they are read from the converted Parquet):

- where the dataset card (`README.md`) lists `configs:`, the files its config (the one named,
  else the one marked `default`, else "default", else the only one) gives the split in
  `data_files` (glob patterns: `*` within a folder, `**` across folders, only as a whole folder
  name, as on the hub; a name starting with "." only where the glob names one, as a local glob
  and the hub read it), relative to its
  `data_dir` where it has one; a config with a `data_dir` and no `data_files` has the split's
  files under `data_dir` found by name, as below;
- else those under `{config}/` (when a config is named) whose path has a folder named `split`,
  or whose file name is the split's name followed by a data file's ending (`train.jsonl.gz`),
  or by `-` or `_` and a digit (`train-00000-of-00004.parquet`; not `train_sft-...`,
  `train.100-...` or `train.clean.100-...`, other splits).

When the main revision has none, the hub's auto-converted Parquet (`refs/convert/parquet`:
`{config}/{split}/*.parquet`; with no config named, "default", else the only config there) is
used; a `partial-{split}` folder there holds only a prefix of a large split, and is read with a
warning saying so. Read from the hub cache, a split with a file missing (any file the split
has in the listing of the whole commit that huggingface_hub keeps with its downloads, or the
`.offsets.npy` that listing has beside a token file; else a numbered shard `-00001-of-00004`)
is an error naming it: the cache holds only part of the split. A split of an MDS or LitData
dataset (an `index.json` beside its shard files), or one read with such a `format`, is an
error: hf:// reads data files. A split not found is an error naming the configs or splits
there are, where the card or the converted layout says (else the folders with data files,
for a config folder not there); a card whose `configs:` are of other types than the hub reads
(a number for a glob, `[z-a]`) is an error naming the card.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import unquote

from zephon_torch._caller import warn
from zephon_torch.errors import ConfigError
from zephon_torch.io._found_files import INDEX_LIKE, INDEXED_SHARD
from zephon_torch.io._hf_card import card_config, card_patterns, card_splits
from zephon_torch.io.formats import EXTENSIONS, INDEXED_FORMATS, detect_format

CONVERTED_REVISION = "refs/convert/parquet"
# how huggingface_hub's file system begins a path of each kind of repo (hf://datasets/org/name)
_REPO_KINDS = frozenset({"datasets", "spaces", "models"})


def parse_hf_url(url: str) -> tuple[str, str | None, str]:
    """Splits `hf://org/name[@revision][/config]/split` into (repo id, config or None, split);
    see `pinned_revision` for the revision."""
    parts = [part for part in url[len("hf://") :].split("/") if part]
    if parts and parts[0] in _REPO_KINDS:  # the hub's reserved names, never an org's
        raise ConfigError(
            f"`path` {url!r} is in the hub file system's form (hf://{parts[0]}/org/name/file); "
            "a split is read as hf://org/name/split or hf://org/name/config/split: leave out "
            f"'{parts[0]}/'"
        )
    if len(parts) not in (3, 4):
        raise ConfigError(
            f"`path` must look like hf://org/name/split or hf://org/name/config/split, got "
            f"{url!r} (a revision with a `/` in its name is written with %2F: @release%2Fv1)"
        )
    repo = f"{parts[0]}/{parts[1].split('@', 1)[0]}"
    config = parts[2] if len(parts) == 4 else None
    return repo, config, parts[-1]


def pinned_revision(url: str) -> str | None:
    """The revision of `hf://org/name@revision/...` (a commit, branch or tag; a `/` in its
    name written `%2F`, as in `@release%2Fv1` or `@refs%2Fconvert%2Fparquet`), else None."""
    parts = [part for part in url[len("hf://") :].split("/") if part]
    if len(parts) < 2 or "@" not in parts[1]:
        return None
    revision = unquote(parts[1].split("@", 1)[1])
    if not revision:
        raise ConfigError(f"{url!r} has an empty revision after '@'")
    return revision


def revisions(url: str, config: str | None) -> list[tuple[str | None, str | None, bool]]:
    """Where to look, in order: (revision, config named or None, whether it is the
    auto-converted Parquet layout): main (or the pinned revision) as uploaded, then the
    converted layout (`refs/convert/parquet`, or the pinned revision, which may be one of its
    commits: then the callers read it by those rules alone, see `pinned_layout`)."""
    pinned = pinned_revision(url)
    converted = CONVERTED_REVISION if pinned is None else pinned
    return [(pinned, config, False), (converted, config, True)]


def pinned_layout(
    url: str, commit: str, conversions: Callable[[], set[str]], *, converted: bool
) -> bool:
    """Whether a look (see `revisions`) at `commit` is to be made: for a pinned revision, only
    by the rules of its layout, the auto-converted Parquet where `commit` is one of that
    branch's `conversions()`, else the uploaded files (the two read a commit differently: the
    converted one folder per config, the uploaded one `**/{split}/` across them). A revision
    not pinned looks both ways, main first."""
    if pinned_revision(url) is None:
        return True
    return converted == (commit in conversions())


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
    chosen = card_config(configs, config)
    data_dir = str(chosen.get("data_dir") or "").strip("/")
    if chosen.get("data_files") is None:  # the split found by name, under data_dir
        return _by_name(files, data_dir or None, split)
    patterns = card_patterns(chosen, split, data_dir)
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
    if not configs and config is not None and not any(f.startswith(f"{config}/") for f in files):
        why = f"no config folder {config!r}{folders_note(files)}"
    elif not found and not configs:
        named, folders = _named_splits(files, config)
        if named:
            why += f"; its files' names read as splits {named}"
        if folders:  # `data/train/0000.jsonl`: split "train", the names read as "0000"
            why += f"; its folders' names read as splits {folders}"
    if not found and configs:
        chosen = card_config(configs, config)
        if chosen.get("data_files") is not None:
            name = chosen.get("config_name", "default")
            why += f"; the card's config {name!r} has splits {card_splits(chosen)}"
    return found, why


def folders_note(files: Sequence[str]) -> str:
    """The folders at the top of a commit (`files`: its repo-relative paths) that hold data
    files, a config each to a URL, for an error naming a config folder the commit lacks."""
    folders = sorted(
        {
            f.split("/", 1)[0]
            for f in files
            if "/" in f
            and detect_format(f) is not None
            and not any(p.startswith((".", "_")) for p in f.split("/"))
        }
    )
    return f" (its folders with data files: {folders})" if folders else " (nor any folder)"


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


def _by_name(files: Sequence[str], folder: str | None, split: str) -> list[str]:
    """The files of `split` by their names (under `folder`): see the module docstring."""
    # the split's name, then `-` or `_` and a digit, or a data file's ending and nothing more:
    # `train.clean.100-00000-of-00001.parquet` is split "train.clean.100", not "train"
    endings = "|".join(re.escape(ending) for ending in sorted(EXTENSIONS, key=len, reverse=True))
    pattern = re.compile(rf"^{re.escape(split)}([-_][0-9]|(?i:{endings})$|$)")
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


def _named_splits(files: Sequence[str], folder: str | None) -> tuple[list[str], list[str]]:
    """The split names the data files under `folder` read as (`_by_name`'s rules, inverted),
    for an error to list: by their names (a name's part before `-` or `_` and a digit, or
    before its ending), and by the folders holding them below `folder`."""
    endings = "|".join(re.escape(ending) for ending in sorted(EXTENSIONS, key=len, reverse=True))
    pattern = re.compile(rf"^(.+?)(?:[-_][0-9].*|(?i:{endings}))$")
    prefix = [] if folder is None else folder.split("/")
    names, folders = set(), set()
    for file in files:
        parts = file.split("/")
        if parts[: len(prefix)] != prefix or detect_format(file) is None:
            continue
        parts = parts[len(prefix) :]
        if any(p.startswith((".", "_")) for p in parts):
            continue
        folders.update(parts[:-1])
        matched = pattern.match(parts[-1])
        if matched:
            names.add(matched.group(1))
    return sorted(names), sorted(folders)


def refuse_indexed(
    url: str, files: Sequence[str], listing: Sequence[str], format_: str | None
) -> None:
    """ConfigError where the split's `files` are an MDS or LitData dataset's: `format_` is one
    of those, or, detecting the format, one of them is an `index.json` with shard or chunk
    files beside it in the commit's `listing`. hf:// reads a split's data files, and such an
    index was read as JSON Lines, one row of index, its shards (no data file ending) left out,
    where the local folder reads the dataset and a local glob of its files refuses it."""
    if format_ in INDEXED_FORMATS:
        raise ConfigError(
            f"{url!r}: `format` is {format_!r}, but hf:// reads a split's data files (JSON "
            "Lines, Parquet, Vortex, .npy), not MDS or LitData datasets: download the "
            "dataset's folder and read it by its local path"
        )
    if format_ is not None:  # a data format, given: its reader says what the files are
        return
    indexes = [file for file in files if INDEX_LIKE.fullmatch(posixpath.basename(file))]
    for index in indexes:
        folder = posixpath.dirname(index)
        shards = sorted(
            file
            for file in listing
            if posixpath.dirname(file) == folder and INDEXED_SHARD.search(posixpath.basename(file))
        )
        if shards:
            include = f"{folder}/*" if folder else "*"
            raise ConfigError(
                f"{url!r}: {index!r} and the {len(shards)} MDS or LitData shard files beside "
                f"it, e.g. {shards[0]!r}, are an MDS or LitData dataset, which hf:// does not "
                "read (it reads a split's JSON Lines, Parquet, Vortex and .npy files): "
                f"download the folder (hf download {parse_hf_url(url)[0]} --repo-type dataset "
                f"--include '{include}') and read it by its local path"
            )


def warn_if_partial(url: str, files: Sequence[str], split: str) -> None:
    """Warn when the split's files are the hub's partial conversion (a prefix of the split)."""
    if any(f"partial-{split}" in file.split("/") for file in files):
        warn(
            f"{url!r} reads the hub's auto-converted Parquet `partial-{split}`: only the first "
            "part of a large split (the hub converts a prefix). Its uploaded files were not "
            "matched to the split; a dataset card listing them under `configs:` fixes that.",
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


def unnumbered(files: Sequence[str]) -> list[str]:
    """The files among `files` that carry no shard number (`-00001-of-00004`): a cache holding
    part of them cannot be told by their names."""
    return [file for file in files if _NUMBERED.match(file) is None]


# `train-00000-of-00002.parquet`, or with a suffix of its own (`...-of-00002-1a2b3c.parquet`)
_NUMBERED = re.compile(
    r"^(?P<stem>.*)-(?P<index>[0-9]+)-of-(?P<total>[0-9]+)(?:-[0-9A-Za-z]+)?"
    r"(?P<extension>\.[^/]*)?$"
)
