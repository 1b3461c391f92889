"""Storage settings of `Dataset.from_path`, from its `io_options`: a frozen dataclass a section.

`IoOptions` holds the sections `cache` (the node-local shard cache), `retry` (`RetryPolicy`),
`parquet` and `mds`, each validated as it is built. A mapping's unknown keys are refused, naming
the known ones; `merged` replaces only the keys it is given, then validates each key against the
others of its section.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from zephon_torch.errors import ConfigError, integer_setting, positive_setting
from zephon_torch.io._retry import RetryPolicy


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
        prefetch_threads: background download threads per process; each lets a reader walk
            512 shards ahead, within `prefetch_bytes` (tiny shards are many to a budget).
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
