"""Datasets on any fsspec file system (s3://, gs://, az://, memory://, ...): settings, listing.

Opening lists the objects once (size and etag or mtime per object); every later read relies
on that listing: the cache keys files by it, so a changed object is downloaded again. An MDS or
LitData directory is told apart by the content of its `index.json`, fetched here (the reader
then reads it again through the cache for its shard table, see `_remote_reader`). Listing and
index reads are retried under the `RetryPolicy`, then fail with a StorageError naming the URL.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from functools import partial
from typing import Any

from zephon_torch.errors import (
    ConfigError,
    ZephonError,
    integer_setting,
    positive_setting,
)
from zephon_torch.io._discover import GLOB_CHARS, detect_files, visible_files
from zephon_torch.io._filesystems import open_filesystem
from zephon_torch.io._index import index_kind, parse_json
from zephon_torch.io._retry import RetryPolicy, call_with_retry, denied, quietly
from zephon_torch.io._shard_cache import CachedObject
from zephon_torch.io._stall import cat_range
from zephon_torch.io._versions import identity
from zephon_torch.io.formats import INDEX_FILE, INDEXED_FORMATS, check_format, check_indexed


@dataclass(frozen=True, kw_only=True)
class CacheOptions:
    """The node-local shard cache.

    Args:
        dir: the cache folder, for remote shards and decompressed JSONL shards (local ones
            too); None means `$ZEPHON_TORCH_CACHE/shards`, else `~/.cache/zephon_torch/shards`.
            Share it between the ranks of a node; keep it on node-local disk.
        max_bytes: the most bytes of shards it holds (default 64 GiB); least recently used
            shards not in use are evicted to stay under it.
        prefetch_bytes: how far ahead of each dataset's readers shards are downloaded, in bytes
            of the shards they read next after the one being read (cached ones included; the
            next one is fetched whatever the budget), per process; 0 turns prefetch off; None
            means a quarter of `max_bytes` shared by the node's processes (divided by
            `LOCAL_WORLD_SIZE` and by the DataLoader's workers), so that together they do not
            evict each other's prefetched shards. At most half of `max_bytes`; where the node's
            processes together would pass that half, each prefetches its part of it (a warning
            says so).
        prefetch_threads: background download threads per process.
        enabled: accepted for the pipeline's `{"cache": {"enabled": True}}`; remote shards
            always go through the cache, so False is refused.
    """

    dir: str | None = None
    max_bytes: int = 64 << 30
    prefetch_bytes: int | None = None
    prefetch_threads: int = 2
    enabled: bool = True

    def __post_init__(self) -> None:
        for name in ("max_bytes", "prefetch_threads"):
            value = positive_setting(getattr(self, name), f"cache `{name}`")
            object.__setattr__(self, name, value)
        if self.prefetch_bytes is not None:
            ahead = integer_setting(self.prefetch_bytes, "cache `prefetch_bytes`")
            if ahead < 0:
                raise ConfigError(
                    f"cache `prefetch_bytes` must be an int >= 0 or None, got {ahead}"
                )
            object.__setattr__(self, "prefetch_bytes", ahead)
        if self.dir is not None and not isinstance(self.dir, (str, os.PathLike)):
            raise ConfigError(f"cache `dir` must be a folder path or None, got {self.dir!r}")
        if self.prefetch_bytes is not None and self.prefetch_bytes > self.max_bytes // 2:
            raise ConfigError(
                f"cache `prefetch_bytes` must be at most half of `max_bytes` "
                f"({self.max_bytes}), got {self.prefetch_bytes}: shards fetched further ahead "
                f"evict each other, and the shards being read, before they are read"
            )
        if self.enabled is not True:
            raise ConfigError(
                f"cache `enabled` must be True: remote shards are read through the node-local "
                f"cache, got {self.enabled!r}"
            )

    @property
    def directory(self) -> str:
        """The cache folder, resolved."""
        root = os.environ.get("ZEPHON_TORCH_CACHE") or os.path.join(
            os.path.expanduser("~"), ".cache", "zephon_torch"
        )
        return os.path.abspath(os.path.expanduser(self.dir or os.path.join(root, "shards")))


@dataclass(frozen=True, kw_only=True)
class ParquetOptions:
    """How Parquet shards are read, local or remote.

    Args:
        row_group_cache_bytes: the most bytes of decoded row groups a dataset keeps per
            process (default 256 MiB, by the footers' uncompressed sizes; Python objects of
            text columns take a few times more). A shuffle window's row groups should fit.
    """

    row_group_cache_bytes: int = 256 << 20

    def __post_init__(self) -> None:
        value = positive_setting(self.row_group_cache_bytes, "parquet `row_group_cache_bytes`")
        object.__setattr__(self, "row_group_cache_bytes", value)


@dataclass(frozen=True, kw_only=True)
class MdsOptions:
    """How MDS shards are read, local or remote.

    Args:
        verify_hashes: check each shard file, the first time a process opens it, against a
            hash `index.json` records for it (MDSWriter's `hashes=[...]`; the fastest one
            recorded: xxh3/xxh64 where `xxhash` is installed, else sha1, sha256, ..., md5). A shard
            whose hash differs is a DataError naming it; an index recording no hash this
            machine can compute is a DataError at open. Costs one read of each shard per
            process (a plain shard is mapped, so the read warms the page cache for the rows).
    """

    verify_hashes: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.verify_hashes, bool):
            raise ConfigError(
                f"mds `verify_hashes` must be True or False, got {self.verify_hashes!r}"
            )


_SECTIONS: dict[str, type[Any]] = {
    "cache": CacheOptions,
    "retry": RetryPolicy,
    "parquet": ParquetOptions,
    "mds": MdsOptions,
}


@dataclass(frozen=True, kw_only=True)
class IoOptions:
    """Storage settings of `Dataset.from_path`, built from its `io_options` mapping.

    Args:
        cache: the shard cache (`{"dir", "max_bytes", "prefetch_bytes", "prefetch_threads"}`).
        retry: the retry policy (`{"attempts", "initial_delay", "max_delay", "timeout",
            "min_rate", "rate_window"}`).
        parquet: Parquet reading (`{"row_group_cache_bytes"}`), for local datasets too.
        mds: MDS reading (`{"verify_hashes"}`), for local datasets too.
    """

    cache: CacheOptions = field(default_factory=CacheOptions)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    parquet: ParquetOptions = field(default_factory=ParquetOptions)
    mds: MdsOptions = field(default_factory=MdsOptions)

    @classmethod
    def of(cls, options: Mapping[str, Any] | IoOptions | None) -> IoOptions:
        """Validates an `io_options` mapping; unknown keys raise ConfigError listing the known."""
        return cls().merged({} if options is None else options)

    def merged(self, overrides: Mapping[str, Any] | IoOptions) -> IoOptions:
        """These options with the keys of an `io_options` mapping replaced, the rest kept, and
        the result validated (a key against the others of its section: `prefetch_bytes`
        against the `max_bytes` it ends up with); an `IoOptions` replaces them all."""
        if isinstance(overrides, IoOptions):
            return overrides
        if not isinstance(overrides, Mapping):
            raise ConfigError(f"`io_options` must be a mapping or None, got {overrides!r}")
        _check_keys("io_options", overrides, tuple(_SECTIONS))
        sections: dict[str, Any] = {}
        for name, kind in _SECTIONS.items():
            keys = overrides.get(name)
            keys = {} if keys is None else keys  # False or [] is a mistake: refused below
            _check_keys(f"io_options[{name!r}]", keys, tuple(f.name for f in fields(kind)))
            sections[name] = replace(getattr(self, name), **keys)
        return IoOptions(**sections)


def _check_keys(what: str, given: Any, known: tuple[str, ...]) -> None:
    if not isinstance(given, Mapping):
        raise ConfigError(f"`{what}` must be a mapping, got {given!r}")
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ConfigError(
            f"`{what}` has unknown keys {unknown}; known keys are {', '.join(sorted(known))}"
        )


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
    """

    format: str
    objects: list[tuple[str, CachedObject]]
    index: str | None = None
    index_data: bytes | None = field(default=None, repr=False)
    fs: Any = field(default=None, repr=False)


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

    def listing() -> tuple[str, dict[str, dict[str, Any]]]:
        if globbing.intersection(root):
            return "glob", fs.glob(root, detail=True)
        # a file lists as itself: no separate isdir/isfile
        found = find_detailed(fs, root, folder=url.endswith("/"))
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
    infos = visible_files(found, root.rstrip("/"), where)
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
    for path in paths:
        infos[path] = dict(sized(fs, path, infos[path], url=name(path), retry=retry))
    return Listing(format_, [(path, identity(name(path), infos[path])) for path in paths], fs=fs)


def find_detailed(fs: Any, path: str, *, folder: bool = False) -> dict[str, dict[str, Any]]:
    """`fs.find(path, detail=True)`: each file under `path` (or `path` itself) with its info;
    adlfs lists a file by its name alone, detail or not, so its infos are asked for. Where
    listing is denied and `path` names one object, that object (`one_object`); not for a
    `folder` (a URL written with a trailing slash, which file systems strip)."""
    try:
        found = fs.find(path, detail=True)
    except Exception as error:
        alone = one_object(fs, path) if denied(error) and not folder else None
        if alone is None:
            raise
        return alone
    if isinstance(found, list):
        found = {name: fs.info(name) for name in found}
    return dict(found)


def one_object(fs: Any, path: str) -> dict[str, dict[str, Any]] | None:
    """`path` with its info where it names one object, else None: asked when listing was
    denied, as a user may hold the right to read objects but not to list (S3's GetObject
    without ListBucket)."""
    try:
        info = fs.info(path)
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
        lambda: fs.info(path), url=url, policy=retry, what="listing"
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
    if check_indexed(kind, format_, url, data is not None) is None:
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
    if scheme not in protocols[1:]:
        return fs.unstrip_protocol  # type: ignore[no-any-return]

    def name(path: str) -> str:
        return f"{scheme}://{fs.unstrip_protocol(path).split('://', 1)[1]}"

    return name
