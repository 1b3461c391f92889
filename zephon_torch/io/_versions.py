"""What tells a remote object's versions apart, for the caches keyed by it.

A listing gives each object a version (an ETag, a hash, else a modification time); the shard
cache and the remembered row counts key the object by size and version, so a changed object is
read anew. Where no version tells a same-size rewrite apart (none listed, or a whole-second
Last-Modified still within its second), each open versions the object itself: it is downloaded
again by every open, never read from an old copy.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import email.utils
import fcntl
import glob
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from zephon_torch._caller import warn
from zephon_torch.errors import without_secrets
from zephon_torch.io._shard_cache import CachedObject

PER_OPEN = "per-open@"  # starts a version given by an open (see `versioned_per_open`)
SETTLE_S = 2.0  # a whole-second modification time is trusted this long after it
_VERSION_KEYS = (
    # GCS: a new one for each write of the data only; the JSON API's `etag` also changes with
    # metadata (an ACL, a label), which would look like a rewrite of the object mid-run
    "generation",
    "ETag",
    "etag",
    "md5Hash",
    "blob_id",
    "LastModified",
    "last_modified",
    "mtime",
    "updated",
    "Content-MD5",  # http(s):// (fsspec reports these answer headers)
    "Digest",
    "Last-Modified",
)


def versioned_per_open(
    objects: list[tuple[str, CachedObject]], dataset: str
) -> list[tuple[str, CachedObject]]:
    """`objects`, those the listing gave no settled version (a server that sends no ETag or
    Last-Modified, or a Last-Modified under `SETTLE_S` old) versioned by this open: a rewrite
    of the same size cannot be told from the copy a node's cache holds, so each open
    downloads them again (with a warning) rather than read an old copy. A Last-Modified
    counts whole seconds: a rewrite within the second it names keeps it, so it settles only
    once that second is over (by this machine's clock). Copies of the dataset (DataLoader
    workers) share this open's version."""
    now = time.time()
    settled = [_settled(item.version, now) for _, item in objects]
    bare = [item.url for (_, item), kept in zip(objects, settled, strict=True) if not kept]
    if not bare:
        return objects
    warn(
        f"dataset {dataset!r}: the storage lists {len(bare)} object(s) without a version "
        f"(ETag or modification time) or modified within the last {SETTLE_S:g} s, e.g. "
        f"{without_secrets(bare[0])!r}; a changed object of the same size could not be told "
        "from a cached copy, so this open downloads them again",
    )
    stamp = f"{PER_OPEN}{time.time_ns()}:"
    return [
        (p, item if kept else replace(item, version=stamp + item.version))
        for (p, item), kept in zip(objects, settled, strict=True)
    ]


def listed_version(item: CachedObject) -> str:
    """The version the storage listed for `item` (none: ""), without this open's stamp (see
    `versioned_per_open`)."""
    if item.version.startswith(PER_OPEN):
        return item.version.split(":", 1)[1]
    return item.version


def _settled(version: str, now: float) -> bool:
    """Whether `version` tells a rewrite of the same size apart: any but none, or a time in
    whole seconds (an HTTP Last-Modified) less than `SETTLE_S` before `now`."""
    if not version:
        return False
    when = None
    with contextlib.suppress(TypeError, ValueError, IndexError, OverflowError):
        when = email.utils.parsedate_to_datetime(version).timestamp()
    if when is None:
        with contextlib.suppress(ValueError, OverflowError):
            # Python 3.10's fromisoformat refuses a "Z" for UTC, which 3.11 reads
            utc = version[:-1] + "+00:00" if version[-1:] in ("Z", "z") else version
            when = datetime.datetime.fromisoformat(utc).timestamp()
    return when is None or not when.is_integer() or now >= when + SETTLE_S


_OPEN_INDEX = "zephon-open-index-"
_OWN_INDEX: dict[str, int] = {}  # this process's folder: its locked descriptor
_MAKING = threading.Lock()
os.register_at_fork(
    before=_MAKING.acquire, after_in_parent=_MAKING.release, after_in_child=_MAKING.release
)


def per_open_index_dir() -> str:
    """The index folder for datasets whose objects are versioned by their open (see
    `versioned_per_open`): their line indexes and row counts, keyed by that version, would
    never be read again, so they go to a temporary folder of this process, removed when it
    exits (DataLoader workers, which end first, read it too). The process holds a lock on
    the folder for its life, so that the folders of killed processes are removed by the next
    process that makes one (liveness is the lock, not a process id: containers sharing /tmp
    each have their own)."""
    with _MAKING:
        return _own_index_dir()


def _own_index_dir() -> str:
    own = next(iter(_OWN_INDEX), None)
    if own is None or not os.path.isdir(own):
        root = tempfile.gettempdir()
        _remove_dead_folders(root)
        making = tempfile.mkdtemp(prefix=f"{_OPEN_INDEX}new-", dir=root)
        held = os.open(making, os.O_RDONLY)
        fcntl.flock(held, fcntl.LOCK_EX)  # before it takes the name that others sweep
        own = making.replace(f"{_OPEN_INDEX}new-", _OPEN_INDEX)
        os.rename(making, own)
        atexit.register(shutil.rmtree, own, ignore_errors=True)
        for fd in _OWN_INDEX.values():  # one removed under this process (a cleaner)
            os.close(fd)
        _OWN_INDEX.clear()
        _OWN_INDEX[own] = held
    return own


def _remove_dead_folders(root: str) -> None:
    """Removes the per-open index folders in `root` that no process holds locked."""
    for folder in glob.glob(os.path.join(root, f"{_OPEN_INDEX}*")):
        if os.path.basename(folder).startswith(f"{_OPEN_INDEX}new-"):
            continue  # being made
        try:
            fd = os.open(folder, os.O_RDONLY)
        except OSError:  # removed meanwhile, or another user's
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(folder, ignore_errors=True)
        except OSError:  # held: in use
            pass
        finally:
            os.close(fd)


def identity(url: str, info: Mapping[str, Any]) -> CachedObject:
    """The cache identity of the object at `url` that a listing gave with `info`."""
    version = next((str(info[key]) for key in _VERSION_KEYS if info.get(key)), "")
    if not version and info.get("created") is not None:
        version = str(info["created"])
    return CachedObject(url=url, size=int(info["size"]), version=version)
