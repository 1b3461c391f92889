"""The builder's frozen records of what each ``Pipeline`` method was asked for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zephon_torch.ops._runner import RunnerKind
from zephon_torch.ops.packers import Algorithm, LongDocuments
from zephon_torch.ops.tokenize import SpecialTokens


@dataclass(frozen=True, kw_only=True)
class Options:
    canonical_replicas: int = 1
    world_size: int | None = None
    rank: int | None = None
    prefetch: int = 8
    read_ahead: int = 2
    io_options: dict[str, Any] | None = None


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


@dataclass(frozen=True, kw_only=True)
class PretokenizedSpec:
    field: str
    eos_token_id: int | None
    parallelism: int
    runner: RunnerKind
