"""The token stage of a recipe: the operators that turn rows into token ids, and padding.

Derived on demand from what the ``Pipeline`` builder recorded (tokenize, tokenize_chat or
pretokenized; payload fields of pack_sequences), so the builder stays a record of choices and
the tokenizer is resolved once per pipeline object.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from zephon_torch._caller import warn
from zephon_torch._specs import check_below_vocab
from zephon_torch.errors import ConfigError
from zephon_torch.ops._runner import RunnerKind
from zephon_torch.ops._tokenizer import ResolvedTokenizer, resolve_tokenizer
from zephon_torch.ops.chat import TokenizeChatOp, chatml, chatml_warning
from zephon_torch.ops.document import DocOp
from zephon_torch.ops.payload import PayloadOp
from zephon_torch.ops.pretokenized import IdCheck, TokenFieldOp
from zephon_torch.ops.tokenize import TokenizeOp

if TYPE_CHECKING:
    from zephon_torch.io import Dataset
    from zephon_torch.pipeline import Pipeline


def doc_ops(self: Pipeline) -> list[DocOp]:
    """The per-document chain after fetch: user maps and filters, payload, token op."""
    where = (list(self._source.names), shard_paths(self))  # user errors name their row
    ops: list[DocOp] = [op.located(where) for op in self._user_ops]
    if self._pack is not None and self._pack.payload_fields:
        ops.append(
            PayloadOp(
                self._pack.payload_fields,
                dataset_names=self._source.names,
                shard_paths=shard_paths(self),
            )
        )
    ops.append(token_stage(self)[0])
    return ops


Fields = tuple[tuple[str, ...], str | None]  # fields read, and the one of token ids
# from, for (the fields, and whether bad rows are skipped), read
ReadDatasets = tuple[tuple["Dataset", ...], tuple[Fields, bool], tuple["Dataset", ...]]


def read_datasets(self: Pipeline) -> tuple[Dataset, ...]:
    """The datasets as the lanes read them: where the recipe reads known fields only (no
    `map` or `filter`, which may read any), each decodes only those (`Dataset.reading`: the
    same rows). Made once per pipeline object, datasets and `bad_rows`, so that the stats
    count the cache use of the readers that read; `options(bad_rows=...)` shares the cache
    with the pipeline it came from, but reads a shard lacking a field otherwise."""
    fields = fields_read(self)
    if fields is None:
        return self._datasets
    skip = self._options.bad_rows == "skip"
    held = self._read_datasets
    if held is not None and held[0] is self._datasets and held[1] == (fields, skip):
        return held[2]
    names, token_field = fields
    read = tuple(_reading(dataset, names, token_field, skip) for dataset in self._datasets)
    if skip:  # a shard lacking a field: its rows skipped each
        from zephon_torch.io._narrowing import NarrowedOrWhole

        read = tuple(
            NarrowedOrWhole(narrow, whole) if narrow is not whole else whole
            for narrow, whole in zip(read, self._datasets, strict=True)
        )
    self._read_datasets = (self._datasets, (fields, skip), read)
    return read


def _reading(
    dataset: Dataset, names: tuple[str, ...], token_field: str | None, skip: bool
) -> Dataset:
    """``dataset.reading(names, token_field)``; under skip, ``dataset`` itself where the
    narrowed open already finds a shard lacking a field (an MDS index lists every shard's
    columns), so that its rows are skipped each, as the recipe read whole skips them."""
    from zephon_torch.io._projection import ColumnMismatch

    try:
        return dataset.reading(names, token_field)
    except ColumnMismatch:
        if not skip:
            raise
        return dataset


def fields_read(self: Pipeline) -> Fields | None:
    """The row fields the recipe reads, and which of them holds token ids (None where a
    payload keeps it too, as read); None where a `map` or `filter` may read any, or no token
    stage is set yet. Under `bad_rows="skip"` a shard lacking a field read (or holding no
    list of ids in it), which fails at its open as no row's fault, is read whole, each of its
    rows then skipped as a row's (`io._narrowing`)."""
    if self._user_ops:
        return None
    payload = self._pack.payload_fields if self._pack is not None else ()
    if self._pretokenized is not None:
        field = self._pretokenized.field
        return tuple(dict.fromkeys((field, *payload))), None if field in payload else field
    if self._tokenize is not None:
        return tuple(dict.fromkeys((self._tokenize.field, *payload))), None
    return None


def shard_paths(self: Pipeline) -> list[list[str]]:
    """Per source, shard index to path: where error messages name a document."""
    return [[shard.path for shard in dataset.shards] for dataset in self._source.datasets]


def token_stage(
    self: Pipeline,
) -> tuple[TokenizeOp | TokenizeChatOp | TokenFieldOp, str, int, RunnerKind]:
    """The operator that yields token ids, its field, parallelism and runner."""
    if self._pretokenized is not None:
        p = self._pretokenized
        op = TokenFieldOp(
            field=p.field,
            eos_token_id=p.eos_token_id,
            dataset_names=self._source.names,
            shard_paths=shard_paths(self),
        )
        return op, p.field, p.parallelism, pretokenized_runner(self)
    spec = self._tokenize
    assert spec is not None
    return tokenize_op(self), spec.field, spec.parallelism, spec.runner


MAPPED_FORMATS = ("npy", "mds", "litdata", "memory")


def pretokenized_runner(self: Pipeline) -> RunnerKind:
    """The pre-tokenized stage's runner: ``"auto"`` is ``"inline"`` when every dataset is a
    local memory-mapped format and no ``map``/``filter`` runs (a document is then a slice: a
    hand-off to another thread would cost more than the work), else ``"threads"``."""
    assert self._pretokenized is not None
    runner = self._pretokenized.runner
    if runner != "auto":
        return runner
    mapped = all(d.format in MAPPED_FORMATS and not d.remote for d in self._datasets)
    return "inline" if mapped and not self._user_ops else "threads"


DEFAULT_PREFETCH = 8


def prefetch_depth(self: Pipeline) -> int:
    """Micro-batches made ahead on a background thread: ``prefetch="auto"`` is none for
    pre-tokenized data, else ``DEFAULT_PREFETCH``. Packing stored ids is cheap work that holds
    the GIL, so a thread cannot overlap it with the consumer, and handing each micro-batch over
    cost more than half of making it (measured: `.npy` 1.6x, Parquet 1.2x faster without);
    decoding and downloads still run ahead on the runner's threads (``read_ahead``)."""
    depth = self._options.prefetch
    if depth != "auto":
        return depth
    return 0 if self._pretokenized is not None else DEFAULT_PREFETCH


def resolve(self: Pipeline) -> ResolvedTokenizer:
    spec = self._tokenize
    assert spec is not None
    if "tokenizer" not in self._resolved:
        self._resolved["tokenizer"] = resolve_tokenizer(
            spec.tokenizer_id,
            spec.tokenizer,
            bos_token=spec.bos_token,
            eos_token=spec.eos_token,
        )
        op = tokenize_op(self)  # validates the special-token policy against the tokenizer
        for warning in _doubts(op):
            warn(warning)
    return self._resolved["tokenizer"]


def _doubts(op: TokenizeOp | TokenizeChatOp) -> list[str]:
    """What to warn of in a tokenizer and its use, once, as the pipeline is built."""
    tokenizer = op.tokenizer
    if isinstance(op, TokenizeChatOp):
        doubt = chatml_warning(tokenizer) if op.template is chatml else None
        return [] if doubt is None else [doubt]
    if len(tokenizer.before) > 1 and op.prefix != list(tokenizer.before):
        names = [tokenizer.backend.id_to_token(i) for i in tokenizer.before]
        added = [tokenizer.backend.id_to_token(i) for i in op.prefix]
        return [
            f"the tokenizer's own post-processing starts every text with {names}; the "
            "pipeline puts only BOS and EOS around a document, by its `special_tokens` "
            f"policy ({op.special_tokens!r}: {added or 'nothing'} before it): where the model "
            "was trained with the rest, put them into the text with a `map` (or use "
            "`tokenize_chat` with the model's template)"
        ]
    if tokenizer.adds_bos and not op.prefix:
        return [
            "the tokenizer starts every sequence with BOS itself, and "
            f"`special_tokens={op.special_tokens!r}` leaves it out of every document; pass "
            "`special_tokens='both'` to keep BOS (and EOS), as the model will see it"
        ]
    return []


def tokenize_op(self: Pipeline) -> TokenizeOp | TokenizeChatOp:
    spec = self._tokenize
    assert spec is not None
    if spec.chat_template is not None:
        return TokenizeChatOp(
            resolve(self),
            field=spec.field,
            chat_template=spec.chat_template,
            template_name=spec.template_name,
            dataset_names=self._source.names,
            shard_paths=shard_paths(self),
        )
    return TokenizeOp(
        resolve(self),
        field=spec.field,
        special_tokens=spec.special_tokens,
        dataset_names=self._source.names,
        shard_paths=shard_paths(self),
    )


def columnar(self: Pipeline) -> bool:
    """Whether documents can travel as token columns (``ops.columns``): pre-tokenized data of
    which nothing but the token field is used (no ``map``/``filter``, no payload fields)."""
    assert self._pack is not None
    return self._pretokenized is not None and not self._user_ops and not self._pack.payload_fields


def id_check(self: Pipeline) -> IdCheck | None:
    """The check of every batch's ids, for pre-tokenized data (tokenizers give valid ids)."""
    if self._pretokenized is None:
        return None
    vocab_size = self._pretokenized.vocab_size
    check_below_vocab("pad_token_id", pad_id(self), vocab_size)
    return IdCheck(
        self._pretokenized.field,
        self._source.names,
        shard_paths(self),
        vocab_size=vocab_size,
    )


def check_kept(self: Pipeline, fields: Iterable[str], what: str) -> None:
    """``ConfigError`` where a dataset opened with ``columns=`` leaves out a field the
    pipeline reads (``what``): every row would fail on it, named as that row's fault. Not
    checked after a ``map``, which may write the field."""
    if self._user_ops:
        return
    for dataset in self._source.datasets:
        kept = dataset.columns
        left_out = [field for field in fields if kept is not None and field not in kept]
        if left_out:
            raise ConfigError(
                f"dataset {dataset.name!r} was opened with columns={list(kept or ())}, which "
                f"leaves out {left_out[0]!r}, the field {what} reads: add it to `columns`"
            )


def check_pad_id(self: Pipeline, pad_token_id: int | None) -> None:
    """Warn where a `pad_token_id` given with a tokenizer lies past its vocabulary: every
    padding position holds it, so the model's embedding needs a row for it (one padded past
    the tokenizer's may have; else the model fails at its first padded batch, on an index)."""
    if pad_token_id is None or self._tokenize is None:
        return
    size = resolve(self).backend.get_vocab_size(with_added_tokens=True)
    if pad_token_id >= size:
        warn(
            f"`pad_token_id` {pad_token_id} lies past the tokenizer's vocabulary ({size} ids): "
            "every padding position holds it, so the model's embedding needs a row for it; "
            "leave it unset to pad with EOS",
        )


def plain_documents(self: Pipeline) -> bool:
    """Whether documents carry only tokens: no chat loss masks and no payload fields."""
    assert self._pack is not None
    chat = self._tokenize is not None and self._tokenize.chat_template is not None
    return not chat and not self._pack.payload_fields


def pad_id(self: Pipeline) -> int:
    assert self._pack is not None
    if self._pack.pad_token_id is not None:
        return self._pack.pad_token_id
    if self._pretokenized is not None:
        eos = self._pretokenized.eos_token_id
        return 0 if eos is None else eos
    eos = resolve(self).eos_id
    return 0 if eos is None else eos
