"""Chat/SFT tokenization: render messages with a template, train only on assistant turns.

A chat template turns a conversation into ``(text, trainable)`` segments. The whole rendered
conversation is tokenized at once (one ``encode_batch`` call per chunk), so the ids are the
ones the same text gets at inference; a token is trainable when its character span overlaps a
trainable segment. (Encoding each segment on its own would give every segment the tokenizer's
start-of-text treatment: a SentencePiece-style tokenizer, Llama or Mistral, would put a "▁"
space before every message.) Packing carries the flags, and ``to_training`` sets ``-100`` on
every label whose target token is not trainable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from zephon_torch._caller import warn
from zephon_torch._conversations import CHATML_ROLES, conversation_problem
from zephon_torch.errors import ConfigError, without_secrets
from zephon_torch.ops._tokenizer import ResolvedTokenizer
from zephon_torch.ops.document import Document, call_user, document_error, encode_texts, owned
from zephon_torch.ops.map import function_name

ChatTemplate = Callable[[list[dict[str, Any]]], list[tuple[str, bool]]]
_CHATML_START = "<|im_start|>"


def chatml(messages: list[dict[str, Any]]) -> list[tuple[str, bool]]:
    """ChatML: ``<|im_start|>{role}\\n{content}<|im_end|>\\n``; assistant content and its end
    marker are trainable, everything else (system, user, role headers, the newline after each
    end marker) is context, as transformers' assistant masks have it. A role other than
    ``CHATML_ROLES`` is a ValueError: spelt otherwise, an assistant turn would train nothing."""
    out: list[tuple[str, bool]] = []
    for number, message in enumerate(messages):
        role = message["role"]
        if role not in CHATML_ROLES:  # "model", "gpt", "Assistant" would train on nothing
            raise ValueError(
                f"message {number} has role {role!r}; chatml knows {list(CHATML_ROLES)} and "
                "trains on 'assistant' turns alone: rename the roles with a `map` before "
                "`tokenize_chat`, or pass your model's own template as a callable"
            )
        out.append((f"{_CHATML_START}{role}\n", False))
        out.append((f"{message['content']}<|im_end|>", role == "assistant"))
        out.append(("\n", False))
    return out


TEMPLATES: dict[str, ChatTemplate] = {"chatml": chatml}


def chatml_warning(tokenizer: ResolvedTokenizer) -> str | None:
    """Why the built-in chatml template's markers would be tokenized as plain text, a format
    the model may never see at inference (None: they are special tokens)."""
    if tokenizer.backend.token_to_id(_CHATML_START) is None:
        return (
            f"the tokenizer has no {_CHATML_START} token: the built-in chatml template's "
            "markers are tokenized as plain text, a format the model may never see at "
            "inference. Pass `chat_template=` a callable that renders your model's own "
            "template as (text, trainable) segments"
        )
    if tokenizer.split_special_tokens:
        return (
            "the tokenizer is set to split special tokens (transformers' "
            "split_special_tokens=True): the chatml template's own markers are tokenized as "
            "plain text too, a format the model may never see at inference. Chat data needs "
            "it off; then a message that spells a marker gets that special token, as with "
            "transformers' apply_chat_template"
        )
    return None


def resolve_template(
    template: str | ChatTemplate, name: str | None = None
) -> tuple[ChatTemplate, str]:
    """A template and its fingerprint name (``name``, else the built-in's, else as a
    ``map``'s: ``function_name``), from a built-in name or a callable."""
    if isinstance(template, str):
        if template not in TEMPLATES:
            known = sorted(TEMPLATES)
            raise ConfigError(
                f"`chat_template` must be a callable or one of {known}, got {template!r}"
            )
        return TEMPLATES[template], template if name is None else name
    if not callable(template):
        raise ConfigError(f"`chat_template` must be a callable or a name, got {template!r}")
    return template, function_name(template, name)


class TokenizeChatOp:
    """Tokenize a messages field with per-token trainable flags.

    Args:
        tokenizer: the resolved backend.
        field: the row field holding ``[{"role": ..., "content": ...}, ...]``.
        chat_template: a built-in name (``"chatml"``) or a callable returning segments.
        template_name: its name in the fingerprint (see ``resolve_template``).
        dataset_names: source index to dataset name, for error messages.
        shard_paths: per source, shard index to path, for error messages.
    """

    def __init__(
        self,
        tokenizer: ResolvedTokenizer,
        *,
        field: str,
        chat_template: str | ChatTemplate,
        template_name: str | None = None,
        dataset_names: list[str],
        shard_paths: list[list[str]],
    ) -> None:
        self.tokenizer = tokenizer
        self.field = field
        self.template, self.template_name = resolve_template(chat_template, template_name)
        self.dataset_names = dataset_names
        self.shard_paths = shard_paths
        self._untrained_warned = False

    def __call__(self, docs: list[Document]) -> list[Document]:
        segments = [self._segments(doc) for doc in docs]
        texts = ["".join(text for text, _ in doc_segments) for doc_segments in segments]
        encodings = encode_texts(
            self.tokenizer.backend,
            texts,
            docs.__getitem__,
            field=self.field,
            dataset_names=self.dataset_names,
            shard_paths=self.shard_paths,
            offsets=True,
        )
        for doc, doc_segments, encoding in zip(docs, segments, encodings):
            doc.tokens = np.asarray(encoding.ids, dtype=np.int32)
            doc.trainable = _token_flags(doc_segments, encoding.offsets)
            doc.data = None
            if not self._untrained_warned and len(doc.tokens) and not doc.trainable.any():
                self._warn_untrained(doc)
        return docs

    def _warn_untrained(self, doc: Document) -> None:
        """Warn, once per process, of a conversation the template marks no token of
        trainable: it trains on nothing (every label -100), which a template whose flags miss
        the assistant's turns does to every conversation, without an error."""
        self._untrained_warned = True
        dataset, shard = self.dataset_names[doc.source], self.shard_paths[doc.source][doc.shard]
        warn(
            f"dataset {dataset!r}, shard {without_secrets(shard)!r}, row {doc.row}: chat template "
            f"{self.template_name!r} marks no token of this conversation trainable, so it is "
            "trained on nothing (every label -100); check which segments the template flags "
            "(warned once)",
        )

    def _segments(self, doc: Document) -> list[tuple[str, bool]]:
        data = doc.data if doc.data is not None else {}
        problem = conversation_problem(self.field, data)
        if problem is not None:
            raise document_error(
                doc, problem, dataset_names=self.dataset_names, shard_paths=self.shard_paths
            )
        messages = data[self.field]
        return call_user(  # read twice (text, then flags): a generator is listed
            lambda m: _checked_segments(self.template(m)),
            owned(messages),  # the template may change them in place (see `owned`)
            doc,
            f"chat template {self.template_name!r}",
            dataset_names=self.dataset_names,
            shard_paths=self.shard_paths,
        )

    def fingerprint(self) -> dict[str, Any]:
        """Tokenizer digest, field, template name, and how conversations are encoded (whole,
        since states of segment-by-segment encoding point at other token ranges)."""
        return {
            "kind": "tokenize_chat",
            "tokenizer": self.tokenizer.digest,
            "field": self.field,
            "chat_template": self.template_name,
            "encoding": "whole conversation",
        }


def _checked_segments(rendered: Any) -> list[tuple[str, bool]]:
    """A template's output as a list, each item a ``(text, trainable)`` pair (else ValueError,
    which ``call_user`` turns into a DataError naming the row)."""
    segments = list(rendered)
    for number, segment in enumerate(segments):
        if not (
            isinstance(segment, (tuple, list))
            and len(segment) == 2
            and isinstance(segment[0], str)
            and isinstance(segment[1], (bool, int, np.bool_, np.integer))
        ):
            raise ValueError(
                f"segment {number} is {segment!r}, not a (text: str, trainable: bool) pair"
            )
    return segments


def _token_flags(
    segments: list[tuple[str, bool]], offsets: list[tuple[int, int]]
) -> np.ndarray[Any, Any]:
    """Per token, whether its character span ``[start, end)`` overlaps a trainable segment (a
    token of no span, as a normalizer's added space, takes its character's flag)."""
    if not offsets:
        return np.zeros(0, dtype=bool)
    chars = np.concatenate(
        [np.full(len(text), trainable, dtype=bool) for text, trainable in segments]
        + [np.zeros(1, dtype=bool)]
    )
    cumulative = np.concatenate([[0], np.cumsum(chars, dtype=np.int64)])
    spans = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    start = np.minimum(spans[:, 0], len(chars) - 1)
    end = np.maximum(spans[:, 1], start + 1)
    flags: np.ndarray[Any, Any] = (cumulative[end] - cumulative[start]) > 0
    return flags
