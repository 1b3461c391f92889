"""Tokenize a text field with the fast backend, adding BOS/EOS by policy.

Calls ``encode_batch_fast`` on the whole chunk (the Rust side releases the GIL and runs on its
own threads) and flattens the ids into one numpy buffer per chunk: no offsets, no per-token
Python work beyond the backend's list of ids.
"""

from __future__ import annotations

from itertools import chain
from typing import Any, Literal

import numpy as np

from zephon_torch.errors import ConfigError
from zephon_torch.io._projection import text_of
from zephon_torch.ops._tokenizer import ResolvedTokenizer
from zephon_torch.ops.document import Document, document_error, encode_texts

SpecialTokens = Literal["eos", "bos", "both", "none"]
SPECIAL_TOKENS = ("eos", "bos", "both", "none")


class TokenizeOp:
    """Replace each document's text field by its token ids.

    Args:
        tokenizer: the resolved backend.
        field: the row field holding the text.
        special_tokens: ``"eos"`` appends EOS to every document (the usual separator for
            packing), ``"bos"`` prepends BOS, ``"both"`` does both, ``"none"`` adds nothing.
            A document whose text gives no token gets none either: it stays empty, and the
            packer counts it as skipped (``"empty"``) rather than train on a lone EOS; one
            carrying a payload (an image without a caption) keeps them, with its payload.
        keep_data: keep the row after tokenizing (for operators that need other fields).
        dataset_names: source index to dataset name, for error messages.
        shard_paths: per source, shard index to path, for error messages.
    """

    def __init__(
        self,
        tokenizer: ResolvedTokenizer,
        *,
        field: str,
        special_tokens: SpecialTokens,
        dataset_names: list[str],
        shard_paths: list[list[str]],
        keep_data: bool = False,
    ) -> None:
        if special_tokens not in SPECIAL_TOKENS:
            raise ConfigError(
                f"`special_tokens` must be one of {list(SPECIAL_TOKENS)}, got {special_tokens!r}"
            )
        self.prefix: list[int] = []
        self.suffix: list[int] = []
        if special_tokens in ("bos", "both"):
            if tokenizer.bos_id is None:
                raise ConfigError(
                    f"`special_tokens={special_tokens!r}` needs a BOS token, and the tokenizer "
                    f"has none known{_its_special(tokenizer)}; pass `bos_token=`"
                )
            self.prefix = [tokenizer.bos_id]
        if special_tokens in ("eos", "both"):
            if tokenizer.eos_id is None:
                raise ConfigError(
                    f"`special_tokens={special_tokens!r}` needs an EOS token, and the tokenizer "
                    f"has none known{_its_special(tokenizer)}; pass `eos_token=` naming one of "
                    "its tokens, or "
                    "`special_tokens='none'` for no token between documents (a tokenizer "
                    "without special tokens has none to name: add one when training it)"
                )
            self.suffix = [tokenizer.eos_id]
        self.tokenizer = tokenizer
        self.field = field
        self.special_tokens = special_tokens
        self.dataset_names = dataset_names
        self.shard_paths = shard_paths
        self.keep_data = keep_data

    def __call__(self, docs: list[Document]) -> list[Document]:
        if not docs:
            return docs
        texts = [self._text(doc) for doc in docs]
        encodings = encode_texts(
            self.tokenizer.backend,
            texts,
            docs.__getitem__,
            field=self.field,
            dataset_names=self.dataset_names,
            shard_paths=self.shard_paths,
        )
        lengths = [len(e) for e in encodings]
        flat = np.fromiter(
            chain.from_iterable(e.ids for e in encodings), dtype=np.int32, count=sum(lengths)
        )
        start = 0
        extra = len(self.prefix) + len(self.suffix)
        for doc, length in zip(docs, lengths):
            if length or doc.payload is not None:
                tokens = np.empty(length + extra, dtype=np.int32)
                tokens[len(self.prefix) : len(self.prefix) + length] = flat[start : start + length]
                tokens[: len(self.prefix)] = self.prefix
                tokens[len(self.prefix) + length :] = self.suffix
            else:  # an empty text stays empty, with no special token (see `with_eos`)
                tokens = np.empty(0, dtype=np.int32)  # not a view holding the chunk's ids
            doc.tokens = tokens
            start += length
            if not self.keep_data:
                doc.data = None
        return docs

    def _text(self, doc: Document) -> str:
        try:
            return text_of(doc.data if doc.data is not None else {}, self.field)
        except ValueError as error:
            raise document_error(
                doc, str(error), dataset_names=self.dataset_names, shard_paths=self.shard_paths
            ) from None

    def fingerprint(self) -> dict[str, Any]:
        """Tokenizer digest, field and special-token policy."""
        return {
            "kind": "tokenize",
            "tokenizer": self.tokenizer.digest,
            "field": self.field,
            "special_tokens": self.special_tokens,
            "prefix": self.prefix,
            "suffix": self.suffix,
        }


def _its_special(tokenizer: ResolvedTokenizer) -> str:
    """The tokenizer's special tokens, for an error that asks the user to name one."""
    try:
        added = tokenizer.backend.get_added_tokens_decoder().values()
    except AttributeError:  # a backend without added tokens to list
        return ""
    names = sorted(token.content for token in added if token.special)
    if not names:
        return " (it has no special tokens)"
    more = f" and {len(names) - 8} more" if len(names) > 8 else ""
    return f" (its special tokens: {names[:8]}{more})"
