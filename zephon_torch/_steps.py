"""The steps of a recipe: the operators a ``Pipeline`` adds, each checked as it is added.

``RecipeSteps`` holds the builder methods of ``Pipeline`` that add one: ``map`` and ``filter``
on rows, one token stage (``tokenize``, ``tokenize_chat`` or ``pretokenized``),
``stateful_filter``, packing (``pack_flat``, ``pack_sequences``), ``shuffle`` and ``batch``.
Each returns a new ``Pipeline`` (``Pipeline._with``) that records the step; the settings
(``options``), the state and the iteration are ``Pipeline``'s own.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal, cast

from zephon_torch._specs import PackSpec, PretokenizedSpec, TokenizeSpec, default_parallelism
from zephon_torch._token_stage import check_kept, check_pad_id, resolve
from zephon_torch.errors import ConfigError, positive_setting
from zephon_torch.ops._runner import RunnerKind
from zephon_torch.ops.chat import ChatTemplate, resolve_template
from zephon_torch.ops.filter import FilterOp
from zephon_torch.ops.map import MapOp, Row
from zephon_torch.ops.packers import Algorithm, LongDocuments
from zephon_torch.ops.stateful import StatefulFilter, filter_name
from zephon_torch.ops.tokenize import SpecialTokens

if TYPE_CHECKING:
    from zephon_torch.pipeline import Pipeline

_DEFAULT_BINS = 8  # open rows of the bin packers


class RecipeSteps:
    """The builder methods of ``Pipeline`` that add a step to its recipe (see ``Pipeline``)."""

    # set by ``Pipeline.__init__`` and ``Pipeline._with``; a mixin of ``Pipeline`` alone, so
    # ``cast("Pipeline", self)`` where a helper of ``_token_stage`` takes the pipeline
    _user_ops: tuple[MapOp | FilterOp, ...]
    _tokenize: TokenizeSpec | None
    _pretokenized: PretokenizedSpec | None
    _pack: PackSpec | None
    _stateful: tuple[tuple[Callable[[int], StatefulFilter], str], ...]
    _with: Callable[..., Pipeline]

    def map(self, fn: Callable[[Row], Row], *, name: str | None = None) -> Pipeline:
        """Apply ``fn(row) -> row`` to every document before tokenizing. ``fn`` must be pure
        (the same row in, the same row out, on every read of the row); it may change its row in
        place: each call gets its own copy of the row's nested lists, dicts and sets and of
        its writable arrays (read-only ones, such as stored token ids, cannot change).
        ``name`` goes into the state fingerprint, so that a state is refused by a pipeline
        with other functions; by default the function's module and qualified name (a
        ``functools.partial``'s with its arguments, a callable object's class's): pass it
        where functions share that (made by one factory, or objects of one class with other
        settings)."""
        self._check_before_tokenize("map")
        return self._with(_user_ops=(*self._user_ops, MapOp(fn, name=name)))

    def filter(self, fn: Callable[[Row], bool], *, name: str | None = None) -> Pipeline:
        """Keep documents whose row satisfies ``fn`` (by the truth value of its result; None
        or a callable is refused, naming the row); evaluated before tokenizing, on a copy of
        the row (what ``fn`` changes there is not kept: a ``map`` changes rows)."""
        self._check_before_tokenize("filter")
        return self._with(_user_ops=(*self._user_ops, FilterOp(fn, name=name)))

    def tokenize(
        self,
        tokenizer_id: str | None = None,
        *,
        tokenizer: Any = None,
        field: str = "text",
        parallelism: int | None = None,
        runner: RunnerKind = "threads",
        special_tokens: SpecialTokens = "eos",
        bos_token: str | None = None,
        eos_token: str | None = None,
    ) -> Pipeline:
        """Tokenize ``field`` with a hub id, a local directory or file, or a tokenizer object
        (``tokenizers.Tokenizer`` or a transformers fast tokenizer), as the first argument or
        as ``tokenizer=``.

        ``parallelism`` (default: twice the CPU count, at most 32; the workers mostly wait in
        the tokenizer's native code) and ``runner`` are performance knobs: they never change
        the data.
        """
        return self._tokenizing(
            tokenizer_id,
            tokenizer=tokenizer,
            field=field,
            parallelism=parallelism,
            runner=runner,
            special_tokens=special_tokens,
            bos_token=bos_token,
            eos_token=eos_token,
        )

    def _tokenizing(
        self,
        tokenizer_id: Any,
        *,
        tokenizer: Any,
        field: str,
        parallelism: int | None,
        runner: RunnerKind,
        special_tokens: SpecialTokens,
        bos_token: str | None = None,
        eos_token: str | None = None,
        chat_template: str | ChatTemplate | None = None,
        template_name: str | None = None,
    ) -> Pipeline:
        """``tokenize``, or ``tokenize_chat`` with ``chat_template``."""
        self._check_before_tokenize("tokenize_chat" if chat_template else "tokenize")
        if tokenizer_id is not None and not isinstance(tokenizer_id, (str, os.PathLike)):
            # a tokenizer object in the first place ("hub id, dir, or object")
            if tokenizer is not None:
                raise ConfigError("`tokenize` needs exactly one of `tokenizer_id` or `tokenizer`")
            tokenizer_id, tokenizer = None, tokenizer_id
        if tokenizer_id is None and isinstance(tokenizer, (str, os.PathLike)):
            tokenizer_id, tokenizer = tokenizer, None  # a path or hub id given as `tokenizer=`
        spec = TokenizeSpec(
            tokenizer_id=None if tokenizer_id is None else os.fspath(tokenizer_id),
            tokenizer=tokenizer,
            field=field,
            parallelism=default_parallelism() if parallelism is None else parallelism,
            runner=runner,
            special_tokens=special_tokens,
            bos_token=bos_token,
            eos_token=eos_token,
            chat_template=chat_template,
            template_name=template_name,
        )
        check_kept(
            cast("Pipeline", self), [field], "`tokenize_chat`" if chat_template else "`tokenize`"
        )
        new = self._with(_tokenize=spec, _resolved={})
        resolve(new)  # fail at build time on a bad tokenizer or special-token policy
        return new

    def tokenize_chat(
        self,
        tokenizer_id: str | None = None,
        *,
        tokenizer: Any = None,
        field: str = "messages",
        chat_template: str | ChatTemplate = "chatml",
        parallelism: int | None = None,
        runner: RunnerKind = "threads",
        template_name: str | None = None,
    ) -> Pipeline:
        """Tokenize conversations (``[{"role", "content"}, ...]`` in ``field``) with a chat
        template; only assistant turns are loss targets (``labels`` elsewhere are ``-100``).
        The template renders every special token itself (BOS too: none is added).

        ``template_name`` goes into the state fingerprint, as a ``map``'s ``name``; by default
        the built-in template's name, or the callable's module and qualified name. Pass it for
        templates that share one (made by a factory, or objects of one class with other
        settings), else a state of one loads into a pipeline of the other."""
        resolve_template(chat_template, template_name)  # validates
        return self._tokenizing(
            tokenizer_id,
            tokenizer=tokenizer,
            field=field,
            parallelism=parallelism,
            runner=runner,
            special_tokens="none",
            chat_template=chat_template,
            template_name=template_name,
        )

    def pretokenized(
        self,
        field: str = "input_ids",
        *,
        eos_token_id: int | None = None,
        vocab_size: int | None = None,
        parallelism: int | None = None,
        runner: RunnerKind | Literal["auto"] = "auto",
    ) -> Pipeline:
        """Take token ids from ``field`` (no tokenizer); append ``eos_token_id`` when set (not
        to an empty document, which is skipped and counted).

        Every batch's ids are checked to lie in ``[0, vocab_size)`` (the model's vocabulary;
        default ``2**31``), a bad one raising ``DataError`` naming its dataset, shard and row,
        where the model would fail on it naming nothing. The check is one pass over each batch
        whatever the bound; it changes no data, so ``vocab_size`` is not in the state.

        ``runner`` (a performance knob): ``"auto"`` reads on the packer's own thread
        (``"inline"``) when every dataset is a local memory-mapped format (``.npy``, MDS,
        LitData) and no ``map``/``filter`` runs, where a document costs a slice (a compressed
        shard is then inflated on that thread when first opened), and on ``"threads"``
        otherwise (Parquet decoding, remote reads, user functions).
        """
        self._check_before_tokenize("pretokenized")
        spec = PretokenizedSpec(
            field=field,
            eos_token_id=eos_token_id,
            parallelism=default_parallelism() if parallelism is None else parallelism,
            runner=runner,
            vocab_size=vocab_size,
        )
        check_kept(cast("Pipeline", self), [field], "`pretokenized`")
        return self._with(_pretokenized=spec)

    def pack_flat(
        self,
        max_length: int,
        algorithm: Algorithm = "wrap",
        *,
        num_bins: int | None = None,
        max_sequences_per_bin: int | None = None,
        long_documents: LongDocuments = "split",
        min_document_length: int = 0,
        pad_token_id: int | None = None,
    ) -> Pipeline:
        """Pack token streams into rows of ``max_length``.

        Args:
            max_length: tokens per row.
            algorithm: ``"wrap"`` (no padding; documents span rows), ``"best_fit"``,
                ``"first_fit"`` or ``"best_fit_wrap"`` (whole documents in ``num_bins`` open
                rows, padded; the last may cut one document per row instead of opening a row).
            num_bins: open rows of the bin packers (default 8; refused with ``"wrap"``).
            max_sequences_per_bin: close a row once it holds this many pieces (bin packers).
            long_documents: documents longer than ``max_length``: ``"split"`` into pieces, or
                ``"drop"`` them (counted in the lane state's ``skipped``).
            min_document_length: drop (and count) documents with fewer tokens.
            pad_token_id: padding id; default the tokenizer's EOS, else 0.
        """
        self._check_not_packed("pack_flat")
        if self._tokenize is None and self._pretokenized is None:
            raise ConfigError(
                "`pack_flat` needs token ids: call `tokenize` (or `pretokenized`) first"
            )
        if algorithm == "wrap" and num_bins is not None:
            raise ConfigError("`num_bins` needs a bin packer, not 'wrap' (which keeps one row)")
        spec = PackSpec(
            max_length=max_length,
            algorithm=algorithm,
            num_bins=_DEFAULT_BINS if num_bins is None else num_bins,
            pad_token_id=pad_token_id,
            max_sequences_per_bin=max_sequences_per_bin,
            long_documents=long_documents,
            min_document_length=min_document_length,
        )
        check_pad_id(cast("Pipeline", self), pad_token_id)
        return self._with(_pack=spec)

    def stateful_filter(
        self, factory: Callable[[int], StatefulFilter], *, name: str | None = None
    ) -> Pipeline:
        """Filter each lane's tokenized documents with a ``StatefulFilter``: one instance per
        lane and source (``factory(lane)`` is called once for each of the lane's datasets), each
        seeing that source's documents serially and in order; its state is part of the lane
        state."""
        if self._tokenize is None and self._pretokenized is None:
            raise ConfigError(
                "`stateful_filter` sees token ids: call `tokenize`, `tokenize_chat` or "
                "`pretokenized` first"
            )
        if not callable(factory):
            raise ConfigError(
                f"`stateful_filter` takes a function of the lane making a StatefulFilter, got "
                f"{factory!r}"
            )
        probe = factory(0)
        if not isinstance(probe, StatefulFilter):
            got = type(probe).__name__
            raise ConfigError(f"`stateful_filter` factory must return a StatefulFilter, got {got}")
        return self._with(_stateful=(*self._stateful, (factory, name or filter_name(probe))))

    def shuffle(self, window: int) -> Pipeline:
        """Shuffle packed rows per lane in blocks of ``window`` rows, a new order every block
        (so every pass); exact on resume, which re-packs at most one block. It always runs
        between packing and batching, wherever it is called after `pack_flat`."""
        if self._pack is None:
            raise ConfigError(
                "`shuffle` shuffles packed rows: call `pack_flat` or `pack_sequences` first"
            )
        window = positive_setting(window, "`window`")
        return self._with(_shuffle_window=window)

    def pack_sequences(
        self,
        max_length: int,
        algorithm: Literal["best_fit", "first_fit"] = "best_fit",
        *,
        payload_fields: tuple[str, ...] | list[str] = (),
        num_bins: int = _DEFAULT_BINS,
        max_sequences_per_bin: int | None = None,
        min_document_length: int = 0,
        pad_token_id: int | None = None,
    ) -> Pipeline:
        """Pack whole documents only (never cut; longer ones are dropped and counted), with
        ``payload_fields`` of each row passed through untouched in ``Batch.payloads`` (image
        bytes, arrays: multimodal samples)."""
        if self._tokenize is None and self._pretokenized is None:
            raise ConfigError(
                "`pack_sequences` needs token ids: call `tokenize` (or `pretokenized`) first"
            )
        self._check_not_packed("pack_sequences")
        if algorithm not in ("best_fit", "first_fit"):
            raise ConfigError(
                f"`pack_sequences` keeps documents whole: `algorithm` must be 'best_fit' or "
                f"'first_fit', got {algorithm!r}"
            )
        new = self.pack_flat(
            max_length,
            algorithm,
            num_bins=num_bins,
            max_sequences_per_bin=max_sequences_per_bin,
            long_documents="drop",
            min_document_length=min_document_length,
            pad_token_id=pad_token_id,
        )
        assert new._pack is not None
        if isinstance(payload_fields, str) or not all(
            isinstance(name, str) and name for name in payload_fields
        ):
            raise ConfigError(
                f"`payload_fields` must be a list of row field names, got {payload_fields!r}"
            )
        check_kept(cast("Pipeline", self), payload_fields, "`payload_fields`")
        new._pack = replace(new._pack, payload_fields=tuple(payload_fields), whole=True)
        return new

    def batch(self, microbatch_size: int) -> Pipeline:
        """Group ``microbatch_size`` rows of one lane into a micro-batch."""
        if self._pack is None:
            raise ConfigError(
                "`batch` needs packed rows: call `pack_flat` or `pack_sequences` first"
            )
        microbatch_size = positive_setting(microbatch_size, "`microbatch_size`")
        return self._with(_microbatch_size=microbatch_size)

    def _check_not_packed(self, what: str) -> None:
        """A second packing replaced the first without a word (and `pack_flat` after
        `pack_sequences` dropped its payloads and its whole documents)."""
        if self._pack is not None:
            have = "pack_sequences" if self._pack.whole else "pack_flat"
            raise ConfigError(
                f"a pipeline packs once and this one has `{have}` already, so `{what}` cannot "
                "follow; to pack otherwise, call it on the pipeline as it was before packing"
            )

    def _check_before_tokenize(self, what: str) -> None:
        if self._tokenize is None and self._pretokenized is None:
            return
        if what in ("map", "filter"):
            raise ConfigError(
                f"`{what}` must come before `tokenize`/`pretokenized` (it works on rows)"
            )
        chat = self._tokenize is not None and self._tokenize.chat_template is not None
        have = "pretokenized" if self._tokenize is None else "tokenize_chat" if chat else "tokenize"
        raise ConfigError(
            f"a pipeline has one token stage (`tokenize`, `tokenize_chat` or `pretokenized`) and "
            f"this one has `{have}` already, so `{what}` cannot follow; to mix text with stored "
            "ids, tokenize the text in a `map` that writes the ids field, then `pretokenized`"
        )
