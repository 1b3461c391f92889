"""Checks of the files a dataset path found, once their format is decided (`_discover`):
an MDS or LitData folder whose index does not read is refused, not read as JSON Lines; files
left out for their ending, a file beside its compressed copy, and `.json` files beside `.jsonl`
ones are warned of, naming them, at the user's `from_path` line; a file linked under two names
is read once. Notes, code and pictures kept
beside the data (`README.md`, `LICENSE`) are left out quietly."""

from __future__ import annotations

import os
import re

from zephon_torch._caller import warn
from zephon_torch.errors import ConfigError, DataError
from zephon_torch.io.formats import COMPRESSION_ENDINGS, ENDINGS, INDEX_FILE

INDEXED_SHARD = re.compile(r"\.mds(\.\w+)?$|\.bin$")  # MDS shards, LitData chunks
# an index.json, or a per-node or per-rank one that litdata.optimize merges into it at its end
INDEX_LIKE = re.compile(r"(\d+[-.])?index\.json$")
# left out of a folder without a word: notes, code and pictures kept beside data, never data
_NOT_DATA = frozenset(
    {".md", ".markdown", ".rst", ".txt", ".log", ".yaml", ".yml", ".toml", ".cfg", ".ini"}
    | {".py", ".ipynb", ".sh", ".lock", ".crc", ".md5", ".sha1", ".sha256", ".sig"}
    | {".png", ".jpg", ".jpeg", ".gif", ".svg", ".pdf", ".html"}
)
# names without an ending left out without a word (in upper case)
_NOT_DATA_NAMES = frozenset(
    {"LICENSE", "LICENCE", "COPYING", "NOTICE", "README", "AUTHORS", "CONTRIBUTORS"}
    | {"CHANGELOG", "CHANGES", "VERSION", "MANIFEST", "MAKEFILE", "DOCKERFILE", "CITATION"}
)
_SHOWN = 3  # files named in a warning of left-out files
_OTHER_COMPRESSIONS = frozenset({".bz2", ".xz", ".lz4", ".br", ".zip", ".7z", ".lzma", ".snappy"})


def warn_of_files(text: str, format_: str, found: list[str], left_out: list[str]) -> None:
    """The warnings of a folder or glob ``text`` whose files of ``format_`` are ``found`` and
    whose other files, of no known ending, are ``left_out``."""
    _warn_left_out(text, left_out)
    _warn_twins(text, found)
    if format_ == "jsonl":
        _warn_json_beside(text, found)


def once_each(text: str, files: list[str]) -> list[str]:
    """``files`` (of the folder or glob ``text``) less those that are other names of a file
    listed before them: links, symbolic or hard, to one file would read its rows once per name
    each pass. Folders linked twice are entered once already (`_discover._tree`); this is the
    same for files, with a warning naming them."""
    first: dict[tuple[int, int], str] = {}
    kept: list[str] = []
    twins: list[str] = []
    for file in files:
        try:
            info = os.stat(file)
        except OSError:  # a link to nothing: refused by the caller
            kept.append(file)
            continue
        same = first.setdefault((info.st_dev, info.st_ino), file)
        if same == file:
            kept.append(file)
        else:
            twins.append(f"{os.path.basename(file)!r} (= {os.path.basename(same)!r})")
    if twins:
        shown = ", ".join(twins[:_SHOWN]) + (
            f" and {len(twins) - _SHOWN} more" if len(twins) > _SHOWN else ""
        )
        warn(
            f"{text!r}: {len(twins)} file(s) are other names (links) of files it reads, and are "
            f"not read again: {shown}. To read a source more often, give it a larger mixture "
            "weight (or `passes=`)",
        )
    return kept


def _some(files: list[str]) -> str:
    """The first few of ``files`` by name, and how many more."""
    named = ", ".join(repr(os.path.basename(file)) for file in files[:_SHOWN])
    return named + (f" and {len(files) - _SHOWN} more" if len(files) > _SHOWN else "")


def refuse_unread_index(text: str, jsonl: list[str], files: list[str]) -> None:
    """Refuse to read an MDS or LitData folder as JSON Lines: its only JSON files (``jsonl``,
    of ``files``) are indexes, the data itself in shard files, and each index would be one
    "document": a `DataError` naming the index where it is the folder's only one (damaged),
    else a `ConfigError`."""
    if not all(INDEX_LIKE.fullmatch(os.path.basename(file)) for file in jsonl):
        return
    shards = [file for file in files if INDEXED_SHARD.search(os.path.basename(file))]
    if not shards:
        return
    names = sorted({os.path.basename(file) for file in jsonl})
    if names == [INDEX_FILE]:
        raise DataError(
            "does not read as an MDS or LitData index (damaged or cut short?), though "
            f"{len(shards)} MDS or LitData shard files lie beside it, e.g. {shards[0]!r}; pass "
            "`format='jsonl'` if it is JSON Lines after all",
            shard=jsonl[0],  # no dataset: `Dataset.from_path` names it (`naming`)
        )
    raise ConfigError(
        f"{text!r} holds {len(shards)} LitData chunk or MDS shard files, e.g. {shards[0]!r}, "
        f"but no {INDEX_FILE}: only a write's per-node or per-rank index(es) "
        f"({', '.join(names)}), which litdata.optimize merges into {INDEX_FILE} as it ends. "
        "The write did not finish: run it again to its end"
    )


def _warn_left_out(text: str, left_out: list[str]) -> None:
    """Say which files of a folder or glob are left out for a name ending in no format
    (notes, code and pictures aside): a `.jsonl.bz2` or `.arrow` shard among the data was
    dropped without a word."""
    dropped = [file for file in left_out if not _quiet(os.path.basename(file))]
    if not dropped:
        return
    packed = [f for f in dropped if os.path.splitext(f)[1].lower() in _OTHER_COMPRESSIONS]
    advice = (
        f" ({os.path.basename(packed[0])!r} is compressed as no reader here reads: recompress "
        "it with gzip or zstd)"
        if packed
        else ""
    )
    warn(
        f"{text!r}: {len(dropped)} file(s) whose names end in no format it reads are left "
        f"out: {_some(dropped)} (it reads {ENDINGS}){advice}. If they are data, give them a "
        "known ending, or pass `format=` with a glob that names them alone",
    )


def named_format_files(where: str, files: list[str]) -> list[str]:
    """The files of a folder (``where``: "directory") read in a format named by `format=`:
    less the notes kept beside data (`README.md`, `LICENSE`), left out quietly as detection
    leaves them out, except `.txt` and `.log` files (JSON Lines are kept so), and unless
    nothing else is there. A file or a glob names its files itself: all are read."""
    if where != "directory":
        return files
    data = [file for file in files if not _notes(file.rsplit("/", 1)[-1])]
    return data or files


def _notes(name: str) -> bool:
    """Whether a file of a folder read with a given format is a note kept beside the data."""
    return _quiet(name) and os.path.splitext(name)[1].lower() not in {".txt", ".log"}


def warn_of_table_log(text: str, log: str | None) -> None:
    """Warn where the folder ``text`` holds a Delta Lake table's log (`_delta_log`, ``log``):
    its files are read as a plain folder's, those that commits removed but no VACUUM deleted
    yet among them, their rows read again beside the rows that replaced them."""
    if log is not None:
        warn(
            f"{text!r} is a Delta Lake table ({log!r}): its Parquet files are read as a "
            "folder's, all of them, also those a later commit removed (until VACUUM deletes "
            "them), whose rows would be read beside the rows that replaced them. Read a "
            "snapshot: VACUUM the table with no retention, or write its current files out"
        )


def _quiet(name: str) -> bool:
    """Whether a file left out is one of the notes kept beside data: a name ending in
    `_NOT_DATA`, or one of `_NOT_DATA_NAMES` (a name without an ending is otherwise warned
    of: Spark's `saveAsTextFile` writes its JSON Lines shards as `part-00000`)."""
    if "." not in name:
        return name.upper() in _NOT_DATA_NAMES
    return os.path.splitext(name)[1].lower() in _NOT_DATA


def _warn_json_beside(text: str, found: list[str]) -> None:
    """Warn where `.json` files are read as JSON Lines beside `.jsonl` or `.ndjson` ones: a
    metadata file kept with the data (`stats.json`) becomes a row of it."""
    json_files = [file for file in found if _ending(file) == ".json"]
    if not json_files or len(json_files) == len(found):
        return
    warn(
        f"{text!r}: {len(json_files)} .json file(s) are read as JSON Lines beside its "
        f".jsonl files: {_some(json_files)}; if they hold metadata, not data, each line of them is "
        "a row. Pass a glob that names the data files alone (such as "
        f"'{os.path.join(text, '**', '*.jsonl*')}') to leave them out",
    )


def _ending(file: str) -> str:
    """A JSON Lines file's ending without its compression: `.json` of `a.json.gz`."""
    name = os.path.basename(file).lower()
    for suffix in COMPRESSION_ENDINGS:
        name = name.removesuffix(suffix)
    return os.path.splitext(name)[1]


def _warn_twins(text: str, found: list[str]) -> None:
    """Warn of files read twice over, likely: a name that is another's plus a compression
    ending (`gzip -k` leaves `train.jsonl` beside `train.jsonl.gz`)."""
    names = set(found)
    twins = [
        (file, file + suffix)
        for file in found
        for suffix in COMPRESSION_ENDINGS
        if file + suffix in names
    ]
    if not twins:
        return
    plain, packed = twins[0]
    more = f" (and {len(twins) - 1} more such pairs)" if len(twins) > 1 else ""
    warn(
        f"{text!r}: {os.path.basename(plain)!r} and {os.path.basename(packed)!r}{more} differ "
        "only by a compression ending: if they hold the same data, every row of them is read "
        "twice; both are read. Remove one, or pass a glob that picks one of each pair",
    )
