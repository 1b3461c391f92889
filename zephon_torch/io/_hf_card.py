"""The `configs:` of a hub dataset card (`README.md`), read as the hub reads them.

Each config's `config_name`, `default`, `data_dir` and `data_files` (a glob, a list of globs, a
list of {split, path} entries, or a mapping of split -> glob(s)) is checked for its types as the
card is read. The config a URL names (else the one marked `default`, else "default", else the
only one) gives a split its globs, as patterns over repo-relative paths (`*` within a folder,
`**` across folders, `[...]` a character class). A `**` within a name (`data/**.parquet`,
`train**`) is an error, as on the hub, whose fsspec glob refuses it (a local or remote glob
reads it as `*`, as Python's glob.glob does; a card meant either that or `**/`, and the hub
loads neither). Which files make up a split: `_hf_splits`.
"""

from __future__ import annotations

import re
import reprlib
from collections.abc import Sequence
from typing import Any

from zephon_torch.errors import ConfigError


def card_configs(card: str | None, *, where: str) -> list[dict[str, Any]]:
    """The `configs:` of a dataset card's YAML header ([] when it has none), each checked
    (`_check_config`) as the hub reads it.

    Raises:
        ConfigError: naming the card (`where`, its URL) and the value, for a header that does
            not parse (nested too deep included), `configs` not a list of mappings, or a config
            whose values are of other types or whose globs are no patterns.
    """
    block = _YAML_BLOCK.match(card or "")
    if block is None:
        return []
    import yaml  # type: ignore[import-untyped]  # huggingface_hub depends on it

    try:
        header = yaml.safe_load(block.group(1))
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


# A card's YAML header as huggingface_hub's card parser (`repocard.REGEX_YAML_BLOCK`, which the
# `datasets` library loads a hub dataset's card with) finds it: after blank lines too, and up to
# a line of `---` alone. A card opening with a blank line (a generated one) had its `configs:`
# left unread, its splits taken by file names: other files than the hub's, silently.
_YAML_BLOCK = re.compile(r"\s*---(?:\r\n|\r|\n)([\S\s]*?)(?:\r\n|\r|\n)---[ \t]*(?:\r\n|\n|$)")


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
            glob = f"{data_dir}/{path}" if data_dir else path
            if any("**" in part and part != "**" for part in glob.split("/")):
                problem, fix = _DOUBLE_STAR, _DOUBLE_STAR_FIX
            else:
                try:
                    _glob(glob)
                    continue
                except re.error as error:
                    problem, fix = str(error), _CLASS_FIX
            raise ConfigError(
                f"the dataset card {where}: the glob {path!r} of split {split!r} of config "
                f"{name!r} is no pattern ({problem}); {fix}"
            )


# The hub resolves a card's globs with fsspec's glob (datasets' resolve_pattern), which refuses
# `**` that is not a whole folder name: `data/**.parquet` or `train**` fails to load there.
_DOUBLE_STAR = "'**' can only be a whole folder name"
_DOUBLE_STAR_FIX = (
    "as the hub reads a card, where it does not load: write 'data/**/*.parquet' for files in "
    "any folder under data/, or 'data/*.parquet' for those in data/ itself"
)
_CLASS_FIX = "`[...]` holds characters or ranges such as [0-4]"


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


def card_config(configs: Sequence[dict[str, Any]], config: str | None) -> dict[str, Any]:
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


def card_splits(chosen: dict[str, Any]) -> list[str]:
    """The splits a card's config names in its `data_files`."""
    return sorted({split for split, _ in _data_files(chosen)})


def card_patterns(chosen: dict[str, Any], split: str, data_dir: str) -> list[CardGlob]:
    """The path patterns a card's config gives `split` ([] for a split it does not have),
    relative to its `data_dir` where it has one."""
    return [
        CardGlob(f"{data_dir}/{path}" if data_dir else path)
        for name, paths in _data_files(chosen)
        if name == split
        for path in paths
    ]


class CardGlob:
    """A data_files glob over repo-relative paths. A file whose name, or a folder's, starts
    with "." matches only where the glob names as many such parts (`data/.extra/*`), as the
    hub reads a card, and as a local glob: `data/**/*.jsonl` read the copies in
    `data/.ipynb_checkpoints/`, rows twice over."""

    def __init__(self, pattern: str) -> None:
        self.regex = _glob(pattern)
        self.hidden = _hidden_parts(pattern.removeprefix("./"))

    def match(self, path: str) -> bool:
        return self.regex.match(path) is not None and _hidden_parts(path) == self.hidden


def _hidden_parts(path: str) -> int:
    """How many of the names of `path` start with "." (not "." or ".." themselves)."""
    return sum(1 for part in path.split("/") if part.startswith(".") and set(part) != {"."})


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
