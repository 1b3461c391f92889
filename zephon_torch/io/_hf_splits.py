"""Which files of a hub dataset repository make up an `hf://` split: pure functions of its
file list and dataset card, shared by the online listing and the hub-cache lookup (`_hf`).

A split's files are found by these rules (the hub's own rules, narrowed: no split synonyms such
as `dev` or `valid`, and no reading of every file as `train` when no name says a split; such
repositories need a card's `configs:`, else they are read from the converted Parquet):

- where the dataset card (`README.md`) lists `configs:`, the files its config (the one named,
  else the one marked `default`, else "default", else the only one) gives the split in
  `data_files` (glob patterns: `*` within a folder, `**` across folders), relative to its
  `data_dir` where it has one; a config with a `data_dir` and no `data_files` has the split's
  files under `data_dir` found by name, as below;
- else those under `{config}/` (when a config is named) whose path has a folder named `split`,
  or whose file name is the split's name followed by a data file's ending (`train.jsonl.gz`),
  or by `-` or `_` and a digit (`train-00000-of-00004.parquet`; not `train_sft-...`,
  `train.100-...` or `train.clean.100-...`, other splits).

When the main revision has none, the hub's auto-converted Parquet (`refs/convert/parquet`:
`{config}/{split}/*.parquet`; with no config named, "default", else the only config there) is
used; a `partial-{split}` folder there holds only a prefix of a large split, and is read with a
warning saying so. Read from the hub cache, a split with a file missing (a numbered shard
`-00001-of-00004`, or any file the split has in the listing of the whole commit that
huggingface_hub keeps with its downloads) is an error naming it: the cache holds only part of
the split. A split not found is an error naming the configs or splits
there are, where the card or the converted layout says; a card whose `configs:` are of other
types than the hub reads (a number for a glob, `[z-a]`) is an error naming the card.
"""

from __future__ import annotations

import re
import reprlib
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import unquote

from zephon_torch._caller import warn
from zephon_torch.errors import ConfigError
from zephon_torch.io.formats import EXTENSIONS, detect_format

CONVERTED_REVISION = "refs/convert/parquet"


def parse_hf_url(url: str) -> tuple[str, str | None, str]:
    """Splits `hf://org/name[@revision][/config]/split` into (repo id, config or None, split);
    see `pinned_revision` for the revision."""
    parts = [part for part in url[len("hf://") :].split("/") if part]
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
    if not configs and config is not None and not any(f.startswith(f"{config}/") for f in files):
        why = f"no config folder {config!r}"
    elif not found and not configs:
        named = _named_splits(files, config)
        if named:
            why += f"; its files' names read as splits {named}"
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
    return sorted({split for split, _ in _data_files(chosen)})


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


def _named_splits(files: Sequence[str], folder: str | None) -> list[str]:
    """The split names the data files under `folder` read as (`_by_name`'s rules, inverted):
    a name's part before `-` or `_` and a digit, or before its ending; for an error to list."""
    endings = "|".join(re.escape(ending) for ending in sorted(EXTENSIONS, key=len, reverse=True))
    pattern = re.compile(rf"^(.+?)(?:[-_][0-9].*|(?i:{endings}))$")
    prefix = [] if folder is None else folder.split("/")
    names = set()
    for file in files:
        parts = file.split("/")
        if parts[: len(prefix)] != prefix or detect_format(file) is None:
            continue
        parts = parts[len(prefix) :]
        if any(p.startswith((".", "_")) for p in parts):
            continue
        matched = pattern.match(parts[-1])
        if matched:
            names.add(matched.group(1))
    return sorted(names)


def card_configs(card: str | None, *, where: str) -> list[dict[str, Any]]:
    """The `configs:` of a dataset card's YAML header ([] when it has none), each checked
    (`_check_config`) as the hub reads it.

    Raises:
        ConfigError: naming the card (`where`, its URL) and the value, for a header that does
            not parse (nested too deep included), `configs` not a list of mappings, or a config
            whose values are of other types or whose globs are no patterns.
    """
    if not card or not card.startswith("---"):
        return []
    end = card.find("\n---", 3)
    if end < 0:
        return []
    import yaml  # type: ignore[import-untyped]  # huggingface_hub depends on it

    try:
        header = yaml.safe_load(card[3:end])
    except (yaml.YAMLError, RecursionError) as error:  # RecursionError: nested too deep
        reason = "it is nested too deep" if isinstance(error, RecursionError) else error
        raise ConfigError(
            f"the dataset card {where}: its YAML header does not parse: {reason}"
        ) from None
    configs = header.get("configs") if isinstance(header, dict) else None
    if configs is None:
        return []
    if not (isinstance(configs, list) and all(isinstance(c, dict) for c in configs)):
        raise ConfigError(
            f"the dataset card {where}: `configs` must be a list of mappings (config_name, "
            f"data_files, ...), got {reprlib.repr(configs)}"
        )
    for chosen in configs:
        _check_config(chosen, where)
    return configs


def _check_config(chosen: dict[str, Any], where: str) -> None:
    """ConfigError naming the card (`where`) and the value unless a card's config is of the
    types the hub reads: `config_name` and `data_dir` strings, `default` true or false, and
    `data_files` (see `_data_files`) whose globs are patterns."""
    name = chosen.get("config_name", "default")
    rules = [
        ("config_name", "a string", isinstance(name, str)),
        ("data_dir", "a string", isinstance(chosen.get("data_dir", ""), (str, type(None)))),
        ("default", "true or false", isinstance(chosen.get("default", False), bool)),
        ("data_files", _DATA_FILES, _data_files_shaped(chosen.get("data_files"))),
    ]
    for key, rule, holds in rules:
        if not holds:
            raise ConfigError(
                f"the dataset card {where}: `{key}` of config {reprlib.repr(name)} must be "
                f"{rule}, got {reprlib.repr(chosen.get(key))}"
            )
    data_dir = str(chosen.get("data_dir") or "").strip("/")
    for split, paths in _data_files(chosen):
        for path in paths:
            try:
                _glob(f"{data_dir}/{path}" if data_dir else path)
            except re.error as error:
                raise ConfigError(
                    f"the dataset card {where}: the glob {path!r} of split {split!r} of config "
                    f"{name!r} is no pattern ({error}); `[...]` holds characters or ranges "
                    "such as [0-4]"
                ) from None


_DATA_FILES = (
    "a glob, a list of globs, a list of {split, path} entries (path a glob or a list of "
    "globs) or a mapping of split -> glob(s)"
)


def _data_files_shaped(data_files: object) -> bool:
    """Whether a card config's `data_files` is absent or of one of the forms `_data_files`
    reads, its splits strings."""

    def globs(value: object) -> bool:
        return isinstance(value, str) or (
            isinstance(value, list) and all(isinstance(v, str) for v in value)
        )

    if isinstance(data_files, dict):
        return all(isinstance(k, str) and globs(v) for k, v in data_files.items())
    if isinstance(data_files, list) and data_files and isinstance(data_files[0], dict):
        return all(
            isinstance(e, dict)
            and isinstance(e.get("split", "train"), str)
            and globs(e.get("path"))
            for e in data_files
        )
    return data_files is None or globs(data_files)


def _data_files(chosen: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """A card config's `data_files` as (split, globs) pairs, in whichever form it is written:
    a glob or a list of globs (split "train"), a list of {split, path} entries (split
    "train" where none is named), or a mapping of split -> glob(s)."""
    data_files = chosen.get("data_files")
    if isinstance(data_files, dict):
        entries = [{"split": key, "path": value} for key, value in data_files.items()]
    elif isinstance(data_files, list) and data_files and isinstance(data_files[0], dict):
        entries = data_files
    else:
        entries = [{"path": data_files}]
    return [
        (
            str(e.get("split", "train")),
            [p] if isinstance(p := e.get("path"), str) else list(p or []),
        )
        for e in entries
    ]


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
    return [
        _glob(f"{data_dir}/{path}" if data_dir else path)
        for name, paths in _data_files(chosen)
        if name == split
        for path in paths
    ]


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


# `train-00000-of-00002.parquet`, or with a suffix of its own (`...-of-00002-1a2b3c.parquet`)
_NUMBERED = re.compile(
    r"^(?P<stem>.*)-(?P<index>[0-9]+)-of-(?P<total>[0-9]+)(?:-[0-9A-Za-z]+)?"
    r"(?P<extension>\.[^/]*)?$"
)
