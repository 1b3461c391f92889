"""Shard hashes as MDSWriter records them in `index.json` (`{"sha1": hexdigest, ...}` per shard
file): which one to compute, and the check of a file's bytes against it."""

from __future__ import annotations

import hashlib
import importlib
import os
from collections.abc import Callable, Mapping
from typing import Any

from zephon_torch.errors import DataError

# fastest first; a 64 MiB shard on 2 cores: xxh3_64 1.8 ms, xxh64 2.9, sha1 31, sha256 33 (with
# the CPU's SHA instructions), md5 77
_PREFERRED = (
    "xxh3_64",
    "xxh3_128",
    "xxh128",
    "xxh64",
    "xxh32",
    "sha1",
    "sha256",
    "sha224",
    "blake2b",
    "blake2s",
    "md5",
)
Hasher = Callable[[Any], Any]  # bytes-like in, an object with hexdigest() out


def hasher(algorithm: str) -> Hasher | None:
    """The hash function named as MDSWriter names it, or None where this machine has none
    (an xxHash one without the `xxhash` package, or an unknown name)."""
    if algorithm.startswith("xxh"):
        try:
            xxhash = importlib.import_module("xxhash")
        except ImportError:
            return None
        found: Hasher | None = getattr(xxhash, algorithm, None)
        return found
    if algorithm.startswith("shake_") or algorithm not in hashlib.algorithms_available:
        return None
    return getattr(hashlib, algorithm, None)


def recorded_hashes(file: Mapping[str, Any]) -> dict[str, str]:
    """The `{algorithm: hexdigest}` an index entry records for a file; one it records in
    another shape counts as none (it is read only with verify_hashes, which then says so)."""
    recorded = file.get("hashes")
    if not isinstance(recorded, dict):
        return {}
    return {name: value for name, value in recorded.items() if isinstance(value, str)}


def pick_hash(recorded: Mapping[str, str]) -> tuple[str, Hasher] | None:
    """Of the hashes `recorded` for a file, the fastest this machine can compute, with its
    function; None when there is none."""
    ordered = sorted(recorded, key=lambda a: (_PREFERRED.index(a) if a in _PREFERRED else 99, a))
    for algorithm in ordered:
        function = hasher(algorithm)
        if function is not None:
            return algorithm, function
    return None


class HashMismatch(DataError):
    """A shard file's bytes do not hash to what its index records. Raised inside a `locate`
    block, it drops a remote shard's node-local copy, so that the next read downloads it
    again."""


class ShardHashes:
    """Checks shard files against the hashes their index records for them, each file version
    (path, inode, size, mtime) once per process.

    Args:
        dataset: the dataset name, for error messages.
    """

    def __init__(self, dataset: str) -> None:
        self.dataset = dataset
        self._verified: set[tuple[str, int, int, int, int]] = set()

    def pick(self, shard: str, recorded: Mapping[str, str]) -> tuple[str, Hasher]:
        """The hash `shard` is checked by.

        Raises:
            DataError: naming the shard, when none of `recorded` can be computed here.
        """
        picked = pick_hash(recorded)
        if picked is None:
            listed = ", ".join(sorted(recorded)) or "none"
            raise DataError(
                f"verify_hashes is on, but the index records no hash of this shard that can "
                f"be computed here (recorded: {listed}; xxh* ones need `pip install xxhash`): "
                "write the dataset with MDSWriter(hashes=[...]), or turn verify_hashes off",
                dataset=self.dataset,
                shard=shard,
            )
        return picked

    def check(
        self, shard: str, local: str, recorded: Mapping[str, str]
    ) -> Callable[[Any], None] | None:
        """What checks the bytes of `local` (the file of `shard`, as stored) against its
        recorded hash; None when this version of the file was checked already."""
        stat = os.stat(local)
        version = (local, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
        if version in self._verified:
            return None
        algorithm, function = self.pick(shard, recorded)

        def check(data: Any) -> None:
            got = function(data).hexdigest()
            if got != recorded[algorithm].lower():
                raise HashMismatch(
                    f"the shard's {algorithm} is {got} where the index records "
                    f"{recorded[algorithm]}: the shard is corrupt, or was changed after the "
                    "index was written",
                    dataset=self.dataset,
                    shard=shard,
                )
            self._verified.add(version)

        return check
