"""Datasets on any fsspec file system (s3://, gs://, az://, memory://, ...): listing.

Opening lists the objects once (size and etag or mtime per object); every later read relies
on that listing: the cache keys files by it, so a changed object is downloaded again. An MDS or
LitData directory is told apart by the content of its `index.json`, fetched here (the reader
then reads it again through the cache for its shard table, see `_remote_reader`). Listing and
index reads are retried under the `RetryPolicy`, then fail with a StorageError naming the URL.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from zephon_torch.errors import ConfigError, ZephonError
from zephon_torch.io._discover import GLOB_CHARS, detect_files, visible_files
from zephon_torch.io._filesystems import open_filesystem
from zephon_torch.io._found_files import named_format_files, warn_of_table_log
from zephon_torch.io._index import index_kind, parse_json
from zephon_torch.io._retry import RetryPolicy, call_with_retry, denied, quietly
from zephon_torch.io._shard_cache import CachedObject
from zephon_torch.io._stall import bounded, cat_range
from zephon_torch.io._versions import identity
from zephon_torch.io.formats import INDEX_FILE, INDEXED_FORMATS, check_format, check_indexed


def is_remote(path: str) -> bool:
    """Whether `path` is a URL other than `file://` (and not `hf://`, resolved apart)."""
    return "://" in path and not path.startswith(("file://", "hf://"))


@dataclass(frozen=True)
class Listing:
    """What a remote URL names.

    Args:
        format: the format of its data.
        objects: each object's file-system path and cache identity, sorted by path: the data
            files, or every file of an MDS or LitData directory.
        index: the URL of the directory's `index.json` for MDS and LitData, else None.
        index_data: the bytes of that `index.json`, as read to tell the format.
        fs: the file system that listed it, for the reader to reuse.
        companions: the URLs of objects listed beside those the URL named, to be read with
            them (the offsets file of a `.npy` token file named alone); not shards.
    """

    format: str
    objects: list[tuple[str, CachedObject]]
    index: str | None = None
    index_data: bytes | None = field(default=None, repr=False)
    fs: Any = field(default=None, repr=False)
    companions: frozenset[str] = frozenset()


def list_remote(
    url: str,
    *,
    format_: str | None,
    storage_options: Mapping[str, Any],
    retry: RetryPolicy,
) -> Listing:
    """Lists the data objects a remote URL names and decides their format.

    A directory holding an MDS or LitData `index.json` (or that index itself) is one indexed
    dataset, told apart by the index's content, as for local paths.

    Raises:
        ConfigError: as `find_files` does.
        StorageError: when listing or reading an index fails after retries, or a file system
            that connects when it is made (ftp://, sftp://, hdfs://) cannot connect.
    """
    fs, root = open_filesystem(url, storage_options)
    if format_ is not None:
        check_format(format_)
    name = url_namer(fs, url)

    # an http(s) URL's "?" starts its query (a signed URL's credentials), not a glob
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    globbing = GLOB_CHARS - {"?"} if {"http", "https"} & set(protocols) else GLOB_CHARS

    as_glob = _python_glob(root)

    def listing() -> tuple[str, dict[str, dict[str, Any]]]:
        pattern = bool(globbing.intersection(root))
        # a file lists as itself: no separate isdir/isfile. A name holding glob characters
        # (`a[1].jsonl`) is read as itself where it exists, as a local path is: the glob read
        # another file (`a1.jsonl`), or none
        try:
            found = find_detailed(fs, root, folder=url.endswith("/"))
        except FileNotFoundError:
            if not pattern:
                raise
            found = {}
        if pattern and not found:
            # as `glob.glob`: a pattern ending in "/" matches folders only, never data files
            return "glob", {} if url.endswith("/") else fs.glob(as_glob, detail=True)
        if list(found) == [root.rstrip("/")]:
            return "file", found
        if found or fs.isdir(root):
            return "directory", found
        raise ConfigError(f"no files found at {url!r}: {_missing(fs, url, root)}")

    try:
        # the first call that reaches the store: a ValueError here is a setting (a malformed
        # endpoint_url), a TypeError an unknown storage option (an AttributeError one of the
        # wrong shape), FileNotFoundError no bucket
        bad = (ValueError, TypeError, AttributeError)
        where, found = call_with_retry(
            listing, url=url, policy=retry, what="listing", permanent=bad
        )
    except ZephonError:
        raise
    except (FileNotFoundError, *bad) as error:
        missing = _missing(fs, url, root) if isinstance(error, FileNotFoundError) else ""
        if missing.startswith(("the bucket", "the container")):
            raise ConfigError(f"cannot list {url!r}: {missing}") from error
        raise ConfigError(
            f"cannot list {url!r} (check the URL and storage_options): "
            f"{type(error).__name__}: {error}"
        ) from error
    if format_ is None or format_ in INDEXED_FORMATS:
        indexed = _indexed(fs, name, url, root, where, found, format_, retry)
        if indexed is not None:
            return indexed
    warn_of_table_log(url, _table_log(found, root, name) if where == "directory" else None)
    infos = visible_files(found, as_glob if where == "glob" else root.rstrip("/"), where)
    if not infos:
        raise ConfigError(f"no files found at {url!r}: the {where} holds no visible files")
    paths = sorted(infos)
    if format_ is None:
        nested = [path for path in paths if posixpath.basename(path) == INDEX_FILE]
        indexes = [p for p in nested if _index_kind(fs, name, p, retry, infos[p]) is not None]
        if indexes:
            raise ConfigError(
                f"{url!r} holds {len(indexes)} MDS/LitData datasets in subfolders, e.g. "
                f"{name(posixpath.dirname(indexes[0]))!r}; make one Dataset "
                "per folder"
            )
        format_, paths = detect_files(url, where, paths)
    else:
        paths = named_format_files(where, paths)
    partners = _offsets_partners(fs, name, paths, infos, where, retry) if format_ == "npy" else []
    for path in paths + partners:
        infos[path] = dict(sized(fs, path, infos[path], url=name(path), retry=retry))
    objects = [(path, identity(name(path), infos[path])) for path in paths + partners]
    return Listing(format_, objects, fs=fs, companions=frozenset(map(name, partners)))


def _table_log(found: Mapping[str, Any], root: str, name: Callable[[str], str]) -> str | None:
    """The URL of the Delta Lake log (`_delta_log`) the folder ``root`` lists in ``found``."""
    log = f"{root.rstrip('/')}/_delta_log/"
    return name(log) if any(path.startswith(log) for path in found) else None


def _python_glob(pattern: str) -> str:
    """`pattern` as fsspec's glob reads what Python's `glob.glob` reads: a `**` within a
    name (`**.jsonl`, `a**`) matches as `*` there, where fsspec refuses it (a ValueError)."""
    return "/".join(
        part if part == "**" else re.sub(r"\*{2,}", "*", part) for part in pattern.split("/")
    )


def _offsets_partners(
    fs: Any,
    name: Callable[[str], str],
    paths: list[str],
    infos: dict[str, dict[str, Any]],
    where: str,
    retry: RetryPolicy,
) -> list[str]:
    """The offsets files beside the `.npy` token files that a URL names alone, or by a glob
    that leaves the offsets out (`?.npy`), where there are some (their infos added to `infos`),
    as a local path's reader finds them beside its files: such a URL was refused for lacking
    them. A glob's folders are listed once each. Not for a folder, whose listing holds them."""
    from zephon_torch.io.npy import unlisted_offsets

    wanted = [partner for partner in unlisted_offsets(paths) if partner not in infos]
    if where == "directory" or not wanted:
        return []
    found: dict[str, Mapping[str, Any]] = {}
    if where == "file":
        [partner] = wanted
        try:
            found[partner] = call_with_retry(
                lambda: fs.info(partner), url=name(partner), policy=retry, what="listing"
            )
        except FileNotFoundError:
            return []
    else:
        for folder in sorted({posixpath.dirname(partner) for partner in wanted}):
            listed = call_with_retry(
                partial(fs.ls, folder, detail=True), url=name(folder), policy=retry, what="listing"
            )
            found.update((entry["name"].rstrip("/"), entry) for entry in listed)
    partners = [path for path in wanted if found.get(path, {}).get("type") == "file"]
    infos.update((path, dict(found[path])) for path in partners)
    return partners


def find_detailed(
    fs: Any, path: str, *, folder: bool = False, bound: RetryPolicy | None = None
) -> dict[str, dict[str, Any]]:
    """`fs.find(path, detail=True)`: each file under `path` (or `path` itself) with its info;
    adlfs lists a file by its name alone, detail or not, so its infos are asked for. Where
    listing is denied and `path` names one object, that object (`one_object`); not for a
    `folder` (a URL written with a trailing slash, which file systems strip). `bound`: each
    request cut at its `timeout` (see `_stall.bounded`; a listing of one object)."""
    ask = partial(_asked, fs, bound)
    try:
        found = ask("find", path, detail=True)
    except Exception as error:
        alone = one_object(fs, path, bound=bound) if denied(error) and not folder else None
        if alone is None:
            raise
        return alone
    if isinstance(found, list):
        found = {name: ask("info", name) for name in found}
    return dict(found)


def _asked(fs: Any, bound: RetryPolicy | None, method: str, *args: Any, **kwargs: Any) -> Any:
    if bound is None:
        return getattr(fs, method)(*args, **kwargs)
    return bounded(fs, method, *args, retry=bound, what="listing", **kwargs)


def one_object(
    fs: Any, path: str, *, bound: RetryPolicy | None = None
) -> dict[str, dict[str, Any]] | None:
    """`path` with its info where it names one object, else None: asked when listing was
    denied, as a user may hold the right to read objects but not to list (S3's GetObject
    without ListBucket)."""
    try:
        info = _asked(fs, bound, "info", path)
    except Exception:  # denied too, or missing: the listing's denial is the answer
        return None
    return {path: info} if info.get("type") == "file" else None


def sized(
    fs: Any, path: str, info: Mapping[str, Any], *, url: str, retry: RetryPolicy
) -> Mapping[str, Any]:
    """`info`, or `fs.info(path)` where a listing gave no size (http(s)://: links found on a
    page, or a file listed as itself without details)."""
    if info.get("size") is not None:
        return info
    found: Mapping[str, Any] = call_with_retry(
        lambda: bounded(fs, "info", path, retry=retry, what="listing"),
        url=url,
        policy=retry,
        what="listing",
    )
    if found.get("size") is None:
        raise ConfigError(f"{url!r} has no known size (the server sent no Content-Length)")
    return found


def _indexed(
    fs: Any,
    name: Callable[[str], str],
    url: str,
    root: str,
    where: str,
    found: dict[str, dict[str, Any]],
    format_: str | None,
    retry: RetryPolicy,
) -> Listing | None:
    """The listing of an MDS or LitData directory (or of its `index.json`), else None.

    Raises:
        ConfigError: for an indexed `format_` that `url` does not hold.
    """
    named_index = where == "file" and posixpath.basename(root) == INDEX_FILE
    if where != "directory" and not named_index:
        if format_ is not None:
            raise ConfigError(
                f"`format` is {format_!r}: `path` must be a directory holding {INDEX_FILE}, "
                f"got {url!r}"
            )
        return None
    directory = posixpath.dirname(root) if named_index else root.rstrip("/")
    index = f"{directory}/{INDEX_FILE}"
    data = _read_index(fs, name, index, retry, found[index]) if index in found else None
    kind = None if data is None else _kind_of(data, name(index))
    if check_indexed(kind, format_, url, None if data is None else name(index)) is None:
        return None
    if named_index:
        found = call_with_retry(
            lambda: fs.find(directory, detail=True), url=url, policy=retry, what="listing"
        )
    infos = visible_files(found, directory, "directory")
    objects = [
        (path, identity(name(path), sized(fs, path, infos[path], url=name(path), retry=retry)))
        for path in sorted(infos)
    ]
    return Listing(str(kind), objects, name(index), index_data=data, fs=fs)


# object stores whose paths start with a bucket (a container on Azure)
_BUCKET_SCHEMES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"})


def _missing(fs: Any, url: str, root: str) -> str:
    """Why `root` lists nothing: its bucket is missing (or unseen with these credentials), as
    far as the store tells, else the path."""
    scheme = url.rsplit("::", 1)[-1].split("://", 1)[0]
    bucket = root.strip("/").split("/", 1)[0]
    if scheme in _BUCKET_SCHEMES and bucket:
        try:
            there = fs.exists(bucket)
        except Exception:  # no answer: say what is known
            there = True
        if not there:
            kind = "container" if scheme in ("az", "abfs", "abfss") else "bucket"
            return (
                f"the {kind} {bucket!r} does not exist, or these credentials cannot see it "
                "(check the URL and storage_options)"
            )
    return "the path does not exist"


def _index_kind(
    fs: Any, name: Callable[[str], str], path: str, retry: RetryPolicy, info: Mapping[str, Any]
) -> str | None:
    """Reads a remote `index.json` (listed with `info`) and returns "mds", "litdata" or None,
    as `index_format`."""
    return _kind_of(_read_index(fs, name, path, retry, info), name(path))


def _read_index(
    fs: Any, name: Callable[[str], str], path: str, retry: RetryPolicy, info: Mapping[str, Any]
) -> bytes:
    """The whole `index.json` at `path`, cut short by `retry`'s rate floor where its size is
    known: from its listing (`info`), else asked (http(s)://), else not cut."""
    size = info.get("size")
    if size is None:
        try:
            size = quietly(lambda: fs.info(path)).get("size")
        except Exception:  # no size to be had: the read, retried, says what is wrong
            size = None
    size = size if isinstance(size, int) and not isinstance(size, bool) else None
    read = partial(cat_range, fs, path, None, None, retry, listed=size)
    data: bytes = call_with_retry(read, url=name(path), policy=retry, what="reading")
    return data


def _kind_of(data: bytes, where: str) -> str | None:
    try:
        index = parse_json(data)
    except ValueError:
        return None
    return index_kind(index, where)


def url_namer(fs: Any, url: str) -> Callable[[str], str]:
    """`fs.unstrip_protocol`, in the scheme `url` was given in: adlfs names its objects
    abfs:// when asked for az://, and a dataset's shards, errors and cache keys must carry
    the URL the user wrote. A chained URL (`simplecache::az://...`) names its objects by its
    last link's scheme, as its wrapping file system names them by its target's."""
    last = url.rsplit("::", 1)[-1]
    scheme = last.split("://", 1)[0] if "://" in last else ""
    target = getattr(fs, "fs", None) if "::" in url else None  # a caching wrapper's target
    protocol = (target if target is not None else fs).protocol
    protocols = (protocol,) if isinstance(protocol, str) else tuple(protocol)
    # adlfs before 2024 has the one protocol "abfs", az:// mapped to it by fsspec's registry
    if not scheme or scheme == protocols[0]:
        return fs.unstrip_protocol  # type: ignore[no-any-return]

    def name(path: str) -> str:
        return f"{scheme}://{fs.unstrip_protocol(path).split('://', 1)[1]}"

    return name
