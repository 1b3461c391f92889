"""The builder's frozen records of what each ``Pipeline`` method was asked for.

Each validates itself at construction and raises ``ConfigError`` naming the argument, the rule
and the value.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from zephon_torch.elastic import check_topology
from zephon_torch.errors import ConfigError, integer_setting, positive_setting
from zephon_torch.ops._runner import RUNNERS, RunnerKind
from zephon_torch.ops.packers import Algorithm, LongDocuments, make_packer
from zephon_torch.ops.tokenize import SpecialTokens

# what a row whose reading or processing raises a DataError naming it does to the run
BadRows = Literal["raise", "skip"]
BAD_ROWS = ("raise", "skip")


@dataclass(frozen=True, kw_only=True)
class Options:
    canonical_replicas: int = 1
    world_size: int | None = None
    rank: int | None = None
    prefetch: int | Literal["auto"] = "auto"
    read_ahead: int = 4
    stats_every: int = 0
    stats: bool = True
    on_stats: Callable[[dict[str, Any]], None] | None = None
    bad_rows: BadRows = "raise"

    def __post_init__(self) -> None:
        for name in ("canonical_replicas", "world_size", "rank", "read_ahead", "stats_every"):
            value = getattr(self, name)
            if value is not None:  # plain ints: the fingerprint and state are JSON
                object.__setattr__(self, name, integer_setting(value, f"`{name}`"))
        # a rank alone is checked against the world the environment gives, when resolved
        rank = self.rank
        if self.world_size is None and rank is not None and rank >= self.canonical_replicas > 0:
            raise ConfigError(
                f"`rank` option is {rank} without `world_size`: a rank lies below the world "
                f"size, which divides `canonical_replicas` ({self.canonical_replicas}); give "
                "`world_size` too, and `canonical_replicas` as the largest world size planned"
            )
        world = self.world_size
        if world is None:
            world = 1 if self.rank is None else self.canonical_replicas
        check_topology(
            canonical_replicas=self.canonical_replicas,
            world_size=world,
            rank=0 if self.rank is None else self.rank,
        )
        if not isinstance(self.stats, bool):
            raise ConfigError(f"`stats` must be True or False, got {self.stats!r}")
        if self.stats_every < 0:
            raise ConfigError(f"`stats_every` must be >= 0, got {self.stats_every}")
        if self.stats_every and not self.stats:
            raise ConfigError(
                f"`stats_every` needs the counters: it must be 0 when `stats` is False, got "
                f"{self.stats_every}"
            )
        if self.on_stats is not None and not callable(self.on_stats):
            raise ConfigError(f"`on_stats` must be a function of the stats, got {self.on_stats!r}")
        if (self.on_stats is None) != (self.stats_every == 0):
            raise ConfigError(
                "`stats_every` and `on_stats` go together: the function is called every "
                f"`stats_every` batches (got {self.stats_every} and {self.on_stats!r})"
            )
        if self.prefetch != "auto":
            try:
                prefetch = integer_setting(self.prefetch, "`prefetch`")
            except ConfigError:
                prefetch = -1
            if prefetch < 0:
                raise ConfigError(
                    f"`prefetch` must be 'auto' or an int >= 0, got {self.prefetch!r}"
                )
            object.__setattr__(self, "prefetch", prefetch)
        if self.read_ahead < 1:
            raise ConfigError(f"`read_ahead` must be an int >= 1, got {self.read_ahead!r}")
        if self.bad_rows not in BAD_ROWS:
            raise ConfigError(f"`bad_rows` must be one of {BAD_ROWS}, got {self.bad_rows!r}")


@dataclass(frozen=True, kw_only=True)
class TokenizeSpec:
    tokenizer_id: str | None
    tokenizer: Any
    field: str
    parallelism: int
    runner: RunnerKind
    special_tokens: SpecialTokens
    bos_token: str | None
    eos_token: str | None
    chat_template: Any = None
    template_name: str | None = None  # the chat template's, in the fingerprint

    def __post_init__(self) -> None:
        if (self.tokenizer_id is None) == (self.tokenizer is None):
            raise ConfigError("`tokenize` needs exactly one of `tokenizer_id` or `tokenizer`")
        _check_field(self.field)
        _check_workers(self.parallelism, self.runner)


@dataclass(frozen=True, kw_only=True)
class PackSpec:
    max_length: int
    algorithm: Algorithm
    num_bins: int
    pad_token_id: int | None
    max_sequences_per_bin: int | None
    long_documents: LongDocuments
    min_document_length: int
    payload_fields: tuple[str, ...] = ()
    whole: bool = False  # set by pack_sequences, whose `long_documents="drop"` is implied

    def __post_init__(self) -> None:
        # whole numbers (numpy's too), kept as plain ints: they go into the fingerprint
        for name in ("max_length", "num_bins", "min_document_length", "max_sequences_per_bin"):
            value = getattr(self, name)
            if value is not None or name != "max_sequences_per_bin":
                object.__setattr__(self, name, integer_setting(value, f"`{name}`"))
        if self.max_length == 1:  # below 1 is refused with the packer's other settings
            raise ConfigError(
                "`max_length` must be at least 2: in rows of one token no token follows "
                "another, so every label would be -100 and the model would learn nothing"
            )
        if self.num_bins < 1:  # the wrap packer has no bins, but a setting is still checked
            raise ConfigError(f"`num_bins` must be positive, got {self.num_bins}")
        make_packer(self.algorithm, self.max_length, self.num_bins, self.max_sequences_per_bin)
        if self.long_documents not in ("split", "drop"):
            raise ConfigError(
                f"`long_documents` must be one of ['split', 'drop'], got {self.long_documents!r}"
            )
        if self.min_document_length < 0:
            raise ConfigError(f"`min_document_length` must be >= 0, got {self.min_document_length}")
        kept_whole = self.whole or self.long_documents == "drop"
        if kept_whole and self.min_document_length > self.max_length:
            raise ConfigError(
                f"`min_document_length` {self.min_document_length} is above `max_length` "
                f"{self.max_length}, and documents are kept whole: none could be packed"
            )
        object.__setattr__(self, "pad_token_id", check_token_id("pad_token_id", self.pad_token_id))


@dataclass(frozen=True, kw_only=True)
class PretokenizedSpec:
    field: str
    eos_token_id: int | None
    parallelism: int
    runner: RunnerKind | Literal["auto"]
    vocab_size: int | None = None

    def __post_init__(self) -> None:
        _check_field(self.field)
        _check_workers(self.parallelism, "threads" if self.runner == "auto" else self.runner)
        object.__setattr__(self, "eos_token_id", check_token_id("eos_token_id", self.eos_token_id))
        if self.vocab_size is not None:
            vocab = integer_setting(self.vocab_size, "`vocab_size`")
            if not 0 < vocab <= 2**31:
                raise ConfigError(f"`vocab_size` must lie in [1, 2**31], got {vocab!r}")
            object.__setattr__(self, "vocab_size", vocab)
            check_below_vocab("eos_token_id", self.eos_token_id, vocab)


def check_below_vocab(name: str, token_id: int | None, vocab_size: int | None) -> None:
    """``ConfigError`` when ``token_id`` is set and not below ``vocab_size`` (when set)."""
    if token_id is not None and vocab_size is not None and token_id >= vocab_size:
        raise ConfigError(
            f"`{name}` {token_id} lies outside the vocabulary: `vocab_size` is {vocab_size}"
        )


def check_token_id(name: str, value: object) -> int | None:
    """``value`` as a Python int (numpy integers too); ``ConfigError`` unless it is None or a
    token id in ``[0, 2**31)``."""
    if value is None:
        return None
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        number = int(value)
        if 0 <= number < 2**31:
            return number
    raise ConfigError(f"`{name}` must be a token id in [0, 2**31), got {value!r}")


def _check_field(field: object) -> None:
    if not isinstance(field, str) or not field:
        raise ConfigError(f"`field` must be a non-empty row field name, got {field!r}")


def _check_workers(parallelism: int, runner: str) -> None:
    positive_setting(parallelism, "`parallelism`")
    if runner not in RUNNERS:
        raise ConfigError(f"`runner` must be one of {list(RUNNERS)}, got {runner!r}")


def default_parallelism() -> int:
    """Twice the CPU count, at most 32: tokenizer workers spend most of their time in native
    code, so more workers than cores keep every core busy."""
    return min(32, 2 * (os.cpu_count() or 1))
