"""Which files a `Dataset.from_path` path names, and in which format.

A path is a file, a directory (searched recursively) or a glob; files come back absolute and
sorted by the bytes of their paths (not by Python's text of them, which orders names that are
not UTF-8 by the locale), so shard order, and with it every pointer stream, depends on neither
the order the file system lists them in nor the locale. Names starting with "." or "_" are
skipped in directories (hidden files, `_SUCCESS` and `_metadata` files that Spark and Hadoop
leave next to the data), as is the line-index cache when it lies inside the data. Remote
listings keep the same files (`visible_files`).
"""

from __future__ import annotations

import fnmatch
import glob
import itertools
import os
import re
import stat
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from zephon_torch.errors import ConfigError
from zephon_torch.io._found_files import (
    named_format_files,
    once_each,
    refuse_unread_index,
    warn_of_files,
    warn_of_table_log,
)
from zephon_torch.io.formats import (
    ENDINGS,
    INDEX_FILE,
    INDEXED_FORMATS,
    check_format,
    detect_format,
    index_format,
    indexed_format,
)

GLOB_CHARS = frozenset("*?[")
SKIPPED_PREFIXES = (".", "_")
_FILE_SYSTEM_FOLDER = "lost+found"


def find_files(
    path: str | os.PathLike[str], *, format_: str | None, exclude: str | Sequence[str] = ()
) -> tuple[str, list[str]]:
    """Lists the data files a path names and decides their format.

    Args:
        path: a file, a directory, a glob (`**` matches across folders), or a `file://` URL.
        format_: the format to read; None detects it from the file name endings, and a format
            given for a directory or glob takes every file whatever its ending.
        exclude: folders whose files are never data (the index and shard caches).

    Returns:
        The format and the files, absolute and sorted; for an MDS or LitData directory (or
        its `index.json`) the format and the one `index.json`.

    Raises:
        ConfigError: for a path naming no files, an unknown format, a file whose format its
            name does not tell, several formats at once, or MDS/LitData indexes below `path`.
    """
    text = _local(os.fspath(path))
    if format_ is not None:
        check_format(format_)
    indexed = _indexed(text, format_)
    if indexed is not None:
        return indexed
    if os.path.isfile(text) or (os.path.lexists(text) and not os.path.isdir(text)):
        files, where = [os.path.abspath(text)], "file"  # not a regular file: refused below
    elif os.path.isdir(text):
        files, where = _walk(text, exclude), "directory"
    elif GLOB_CHARS.intersection(text):
        files, where = _glob(text, exclude), "glob"
    else:
        raise ConfigError(f"no files found at {text!r}: the path does not exist")
    if not files:
        raise ConfigError(f"no files found at {text!r}: the {where} holds no visible files")
    found_format, found = (
        (format_, named_format_files(where, files))
        if format_ is not None
        else _detect(text, where, files)
    )
    _check_regular(found)
    if where == "directory":
        log = os.path.join(text, "_delta_log")
        warn_of_table_log(text, log if os.path.isdir(log) else None)
    return found_format, found if where == "file" else once_each(text, found)


def _check_regular(files: list[str]) -> None:
    """Refuse a data file that is not a regular file: opening a named pipe waits for a writer
    that may never come, and a link to nothing holds no data."""
    for file in files:
        if os.path.isfile(file):
            continue
        try:
            mode = os.stat(file).st_mode
        except OSError:
            kind = "a link to a file that does not exist"
        else:
            kind = (
                "a named pipe"
                if stat.S_ISFIFO(mode)
                else "a socket"
                if stat.S_ISSOCK(mode)
                else "a device"
            )
        raise ConfigError(
            f"{file!r} is not a regular file ({kind}): a dataset reads regular files only; "
            "move it out of the dataset's folder or leave it out of the glob"
        )


def _indexed(text: str, format_: str | None) -> tuple[str, list[str]] | None:
    """The format and `index.json` of an MDS or LitData directory (or its index), else None."""
    named_index = os.path.basename(text) == INDEX_FILE and os.path.isfile(text)
    directory = os.path.dirname(text) if named_index else text
    if named_index or os.path.isdir(directory):
        found = indexed_format(directory, format_)
        if found is not None:
            return found, [os.path.abspath(os.path.join(directory, INDEX_FILE))]
    if format_ in INDEXED_FORMATS:
        raise ConfigError(
            f"`format` is {format_!r}: `path` must be a directory holding {INDEX_FILE}, "
            f"got {text!r}"
        )
    return None


def _local(text: str) -> str:
    if text.startswith("file://"):
        text = text[len("file://") :]
    elif "://" in text:
        scheme = text.split("://", 1)[0]
        raise ConfigError(
            f"`path` must be local: {scheme}:// URLs are not supported yet, got {text!r}"
        )
    return os.path.expanduser(text)


def _skipped(exclude: str | Sequence[str]) -> set[str]:
    return {
        os.path.realpath(folder) for folder in ([exclude] if isinstance(exclude, str) else exclude)
    }


def _walk(directory: str, exclude: str | Sequence[str]) -> list[str]:
    """The files under ``directory``, through linked folders too, each folder once (see
    ``_tree``); names starting with "." or "_" are left out."""
    return sorted(
        (
            os.path.abspath(os.path.join(root, name))
            for root, _, names in _tree(directory, _skipped(exclude), _visible, once=True)
            for name in names
            if not name.startswith(SKIPPED_PREFIXES)
        ),
        key=os.fsencode,
    )


def _visible(folders: list[str]) -> bool:
    return not folders[-1].startswith(SKIPPED_PREFIXES)


def _tree(
    top: str, skipped: set[str], enter: Callable[[list[str]], bool], *, once: bool
) -> Iterator[tuple[str, list[str], list[str]]]:
    """Each folder under ``top`` (``top`` too) with its path from ``top`` (its folder names)
    and its file names, through linked folders but never through a link back up (a folder
    within itself). With ``once``, each real folder is entered once, by its first link in
    name order (the same in every run); else by every path (a glob may match one and not
    another; its matches are read once). Folders in ``skipped`` are not entered, nor those
    ``enter`` (given a folder's path from ``top``) refuses. A folder that cannot be listed (no
    permission) raises its `OSError`: left out, as `os.walk` leaves it, its files were
    silently missing from the dataset."""
    entered = {os.path.realpath(top)}
    below: dict[str, tuple[list[str], frozenset[str]]] = {top: ([], frozenset(entered))}
    for root, folders, names in os.walk(top, onerror=_unlisted, followlinks=True):
        where, above = below.pop(root)
        kept = []
        for folder in sorted(folders, key=os.fsencode):
            real = os.path.realpath(os.path.join(root, folder))
            if real in skipped or real in above or (once and real in entered):
                continue
            if not enter([*where, folder]):
                continue
            entered.add(real)
            kept.append(folder)
            below[os.path.join(root, folder)] = ([*where, folder], above | {real})
        folders[:] = kept
        yield root, where, names


def _unlisted(error: OSError) -> None:
    """`os.walk`'s `onerror`: raise, but for the `lost+found` of a file system's root (root's
    alone, never data), which a dataset kept at a mount point holds."""
    if os.path.basename(os.fsdecode(error.filename or "")) != _FILE_SYSTEM_FOLDER:
        raise error


def _glob(pattern: str, exclude: str | Sequence[str]) -> list[str]:
    """The files ``pattern`` matches, as ``glob.glob`` matches names (hidden ones only by a
    pattern part starting with "."), each real folder's files once: ``glob.glob`` follows a
    ``**`` through a link back up until the system's limit on links (a file read 40 times,
    or a listing that never ends with two such links) and through every link to one folder."""
    skipped = _skipped(exclude)
    parts = pattern.split(os.sep)
    if "**" in parts:
        fixed = list(itertools.takewhile(lambda part: not GLOB_CHARS.intersection(part), parts))
        top = os.sep.join(fixed) or ("." if not pattern.startswith(os.sep) else os.sep)
        rest = parts[len(fixed) :]
        matches = []
        for root, folders, names in _tree(top, skipped, lambda p: _may_hold(rest, p), once=False):
            matches += [os.path.join(root, n) for n in names if glob_shows(rest, [*folders, n])]
    else:
        inside = tuple(os.path.join(folder, "") for folder in skipped)
        matches = [m for m in glob.glob(pattern) if not os.path.realpath(m).startswith(inside)]
    first: dict[str, str] = {}  # real folder -> the path its files are read by
    files = []
    found = (os.path.abspath(m) for m in matches if not os.path.isdir(m))
    for match in sorted(found, key=os.fsencode):
        folder = os.path.dirname(match)
        if first.setdefault(os.path.realpath(folder), folder) == folder:
            files.append(match)
    return files


def _detect(text: str, where: str, files: list[str]) -> tuple[str, list[str]]:
    nested = [
        os.path.dirname(file)
        for file in files
        # not opened unless regular (a named pipe's open waits for ever): refused later
        if os.path.basename(file) == INDEX_FILE
        and os.path.isfile(file)
        and index_format(file) is not None
    ]
    if nested:
        raise ConfigError(
            f"{text!r} holds {len(nested)} MDS/LitData datasets in subfolders, e.g. "
            f"{nested[0]!r}; make one Dataset per folder"
        )
    return detect_files(text, where, files)


_SHARD_NAMES = {
    "MDS": re.compile(r"\.mds(\.[a-z0-9]+)?$"),  # shard.00000.mds, shard.00000.mds.zstd
    "LitData": re.compile(r"^chunk-\d+-\d+(\.[a-z0-9]+)?\.bin$"),  # chunk-0-0(.zstd).bin
}


def _unindexed_shards(files: list[str]) -> str:
    """A hint where ``files`` look like the shards of an MDS or LitData dataset whose
    ``index.json`` is missing (its writer had not finished, or it was not copied)."""
    for kind, pattern in _SHARD_NAMES.items():
        shards = [f for f in files if pattern.search(os.path.basename(f))]
        if shards:
            return (
                f"they look like {kind} shards ({os.path.basename(shards[0])!r}) without the "
                "index.json an MDS or LitData dataset is read through: its writer writes it "
                "when it finishes; copy it with the shards, or write the dataset again"
            )
    return ""


def detect_files(text: str, where: str, files: list[str]) -> tuple[str, list[str]]:
    """Decides the one format of `files` (found at `text`, a "file", "directory" or "glob")
    from their name endings, dropping files whose ending means no format.

    Raises:
        ConfigError: when no file has a known ending, or the files mix formats.
    """
    by_format: dict[str, list[str]] = {}
    left_out = []
    for file in files:
        detected = detect_format(file)
        if detected is not None:
            by_format.setdefault(detected, []).append(file)
        else:
            left_out.append(file)
    if list(by_format) == ["jsonl"]:
        refuse_unread_index(text, by_format["jsonl"], files)
    if not by_format:
        if where == "file":
            raise ConfigError(
                f"cannot tell the format of {text!r} from its name: known endings are "
                f"{ENDINGS}; pass `format=`"
            )
        advice = _unindexed_shards(files) or "pass `format=` to read them all as one format"
        raise ConfigError(
            f"no files found at {text!r}: none of its {len(files)} files ends in a known "
            f"extension ({ENDINGS}); {advice}"
        )
    if len(by_format) > 1:
        listed = "; ".join(
            f"{name}: {len(found)} files, e.g. {found[0]!r}"
            for name, found in sorted(by_format.items())
        )
        one = (
            "a config of the dataset card (`configs:`, `data_files`) naming one format's "
            "files, or a local glob of a download"
            if text.startswith("hf://")  # globs are no hf:// paths
            else "for example with a glob such as 'data/**/*.parquet'"
        )
        raise ConfigError(
            f"{text!r} mixes formats ({listed}); point `path` at one format, {one}, and make "
            "one Dataset per format"
        )
    [(detected_format, found)] = by_format.items()
    if where != "file":
        warn_of_files(text, detected_format, found, left_out)
    return detected_format, found


def visible_files(
    found: dict[str, dict[str, Any]], base: str, where: str
) -> dict[str, dict[str, Any]]:
    """The files of a remote listing (path -> info) of `base`, kept as a local path's would be:
    less, in a directory, those whose names (or folders' names) start with "." or "_"; of a
    glob `base`, those a local glob leaves out (`glob_shows`)."""
    if where == "glob":
        parts = base.split("/")
        literal = next(i for i, part in enumerate(parts) if GLOB_CHARS.intersection(part))
        prefix, pattern = "/".join(parts[:literal]), parts[literal:]
    infos: dict[str, dict[str, Any]] = {}
    for path, info in found.items():
        if info.get("type", "file") != "file":
            continue
        if where == "glob":
            relative = path[len(prefix) :].lstrip("/") if path.startswith(prefix) else path
            names = relative.split("/")
            if any(n.startswith(".") for n in names) and not glob_shows(pattern, names):
                continue
        else:
            relative = path[len(base) :].lstrip("/") if path.startswith(base) else path
            if where == "directory" and any(
                part.startswith(SKIPPED_PREFIXES) for part in relative.split("/")
            ):
                continue
        infos[path] = info
    return infos


def glob_shows(pattern: list[str], names: list[str]) -> bool:
    """Whether a local glob of `pattern` (its parts) matches the path `names`: a name starting
    with "." only where the pattern's part for it starts with "." too, and never through a
    `**` (as `glob.glob` has it; the file system's glob matched such names anyway)."""
    if not pattern:
        return not names
    head, rest = pattern[0], pattern[1:]
    if head == "**":  # zero or more folders, none hidden (one name at least, if last)
        for skipped in range(0 if rest else 1, len(names) + 1):
            if skipped and names[skipped - 1].startswith("."):
                return False
            if glob_shows(rest, names[skipped:]):
                return True
        return False
    if not names or (names[0].startswith(".") and not head.startswith(".")):
        return False
    return fnmatch.fnmatchcase(names[0], head) and glob_shows(rest, names[1:])


def _may_hold(pattern: list[str], folders: list[str]) -> bool:
    """Whether a local glob of ``pattern`` (its parts) may match a file below the folder at
    ``folders`` (its names): the walk enters no other folder (hidden ones only for a pattern
    part starting with ".", as ``glob.glob``)."""
    if not folders:
        return bool(pattern)
    if not pattern:
        return False
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        if _may_hold(rest, folders):
            return True
        return not folders[0].startswith(".") and _may_hold(pattern, folders[1:])
    if folders[0].startswith(".") and not head.startswith("."):
        return False
    return fnmatch.fnmatchcase(folders[0], head) and _may_hold(rest, folders[1:])
