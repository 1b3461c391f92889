"""The unit that flows through per-document operators, and the stateless operator protocol.

Per-document operators (fetch, map, filter, tokenize) are pure functions over a list of
documents. They are fused into one chain that an in-order parallel mapper runs on chunks, so
their cost is paid on worker threads or processes, never on the packer's thread.
"""

from __future__ import annotations

import copy
import itertools
import pickle
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from zephon_torch.errors import DataError, ZephonError, row_fault
from zephon_torch.ops._encodes import ENCODES

R = TypeVar("R")
T = TypeVar("T")

Tokens = npt.NDArray[np.integer[Any]]  # int32 from tokenizers; stored type when pre-tokenized


@dataclass(slots=True)
class Document:
    """One document of one source in one lane.

    ``pass_index`` and ``pos`` locate it in its lane's pointer stream, which is all a state needs
    to find it again; ``shard`` and ``row`` locate it in storage for error messages.
    ``trainable`` (chat data) marks, per token, whether it is a loss target; None: all are.
    ``payload`` holds row fields kept whole for ``pack_sequences`` (image bytes, arrays).
    ``error`` (``bad_rows="skip"``): why the row gave no document, which then has no data and
    no tokens; the packer counts it as malformed.
    """

    source: int
    pass_index: int
    pos: int
    shard: int
    row: int
    data: dict[str, Any] | None
    tokens: Tokens | None = None
    trainable: npt.NDArray[np.bool_] | None = None
    payload: dict[str, Any] | None = None
    error: str | None = None


class DocOp(Protocol):
    """A stateless per-document operator: documents in, documents out (fewer if filtering)."""

    def __call__(self, docs: list[Document]) -> list[Document]: ...

    def fingerprint(self) -> dict[str, Any]:
        """Its data-affecting parameters, JSON-able."""
        ...


def skipping_bad(
    step: Callable[[list[T]], list[R]],
    items: list[T],
    bad: Callable[[T, DataError], R],
    named: Callable[[list[T], DataError], int | None] | None = None,
) -> list[R]:
    """``step(items)``, where each item whose own processing raises a ``DataError`` naming a
    row gives ``bad(item, error)`` instead (``bad_rows="skip"``). A failing list is cut around
    the item the error names (``named``: its index there, or None), that item tried alone,
    so k bad rows cost at most 3k more calls of ``step`` and the good items stay in few, long
    calls (a tokenizer's batches); where none is named, it is halved (about k·log2(n) more
    calls). None where no row is bad. An error that is no row's (``row_fault``) is raised."""
    if not items:
        return []
    try:
        return step(items)
    except DataError as error:
        if not row_fault(error):
            raise
        if len(items) == 1:
            return [bad(items[0], error)]
        at = None if named is None else named(items, error)
    cuts = [len(items) // 2] if at is None else [at, at + 1]
    parts = [items[a:b] for a, b in itertools.pairwise([0, *cuts, len(items)])]
    return [out for part in parts for out in skipping_bad(step, part, bad, named)]


def index_named(
    error: DataError, places: Iterable[tuple[int, int]], shards: Sequence[Any]
) -> int | None:
    """The index among ``places`` (shard index, row) of the row ``error`` names, its shard
    told by path (``shards``: the dataset's); None where none is (``skipping_bad``'s
    ``named``)."""
    for at, (shard, row) in enumerate(places):
        if row == error.row and shards[shard].path == error.shard:
            return at
    return None


NO_TOKENS: Tokens = np.empty(0, dtype=np.int32)
NO_TOKENS.flags.writeable = False


def bad_document(source: int, at: Any, error: DataError) -> Document:
    """The document at ``at`` (a ``Pointer`` or ``Document``: its pass, position, shard and
    row) of ``source``, skipped for ``error``: no data, no tokens."""
    return Document(
        source, at.pass_index, at.pos, at.shard, at.row, None, NO_TOKENS, error=str(error)
    )


def document_error(
    doc: Document, message: str, *, dataset_names: list[str], shard_paths: list[list[str]]
) -> DataError:
    """A ``DataError`` naming the document's dataset, shard path and row."""
    return DataError(
        message,
        dataset=dataset_names[doc.source],
        shard=shard_paths[doc.source][doc.shard],
        row=doc.row,
    )


_NESTED = (list, dict, set)


def owned(value: Any) -> Any:
    """``value`` (a row, or a row's value) as a user's function may change it in place: its
    nested lists, dicts and sets, and its writable arrays, copied; the rest as it is (read-only
    arrays, such as the token views readers give, cannot be changed). Readers may share them
    with a cache (Parquet row groups, LitData batches) or with the caller's own data
    (``Dataset.from_dict``), so an edit made in place would reach later reads of the row: later
    passes, resumes, and the other runners' reads alike. Copied through pickle (C speed; a
    row without nested values costs one scan), else by ``copy.deepcopy``."""
    if isinstance(value, dict):
        if not any(_shared(v) for v in value.values()):
            return value
        return {k: _copied(v) if _shared(v) else v for k, v in value.items()}
    return _copied(value) if _shared(value) else value


def _shared(value: Any) -> bool:
    """Whether ``value`` could be changed in place."""
    if isinstance(value, np.ndarray):
        return bool(value.flags.writeable)
    return isinstance(value, _NESTED)


def _copied(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.copy()
    try:
        return pickle.loads(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:  # a value pickle cannot take
        try:
            return copy.deepcopy(value)
        except Exception:  # nor deepcopy: left as it is
            return value


def call_user(
    fn: Callable[[Any], R],
    arg: Any,
    doc: Document,
    what: str,
    *,
    dataset_names: list[str],
    shard_paths: list[list[str]],
) -> R:
    """``fn(arg)`` for a user's function ``what`` on ``doc``: a ZephonError passes as it is
    (a DataError that names no place first names the document), any other error becomes a
    DataError naming the document (its cause chained)."""
    try:
        return fn(arg)
    except DataError as error:  # the type bad input should raise: kept, with its message
        error.locate(
            dataset=dataset_names[doc.source], shard=shard_paths[doc.source][doc.shard], row=doc.row
        )
        raise
    except ZephonError:
        raise
    except Exception as error:
        message = f"{what} raised {type(error).__name__}: {error}"
        raise document_error(
            doc, message, dataset_names=dataset_names, shard_paths=shard_paths
        ) from error


def encode_texts(
    backend: Any,
    texts: list[str],
    owner: Callable[[int], Document],
    *,
    field: str,
    dataset_names: list[str],
    shard_paths: list[list[str]],
    offsets: bool = False,
) -> list[Any]:
    """``backend.encode_batch_fast(texts)`` without special tokens; ``owner(i)`` is the
    document of ``texts[i]``; ``offsets``: ``encode_batch``, whose encodings hold each token's
    character span.

    Raises:
        DataError: naming the document of the first text the tokenizer refuses, looked for
            only after the batch failed (the backend raises a bare Exception or TypeError
            naming no text): one that is not valid Unicode (a lone surrogate, such as the JSON
            escape "\\ud800" gives), or one it cannot encode (a vocabulary without its
            unknown token and a word it does not hold), the tokenizer's error chained.
    """
    encode = backend.encode_batch if offsets else backend.encode_batch_fast
    with ENCODES.running():  # waited for at exit (see ``ops._encodes``)
        try:
            return list(encode(texts, add_special_tokens=False))
        except Exception:
            for at, text in enumerate(texts):
                problem, cause = _refusal(encode, text)
                if problem is not None:
                    raise document_error(
                        owner(at),
                        f"field {field!r} {problem}",
                        dataset_names=dataset_names,
                        shard_paths=shard_paths,
                    ) from cause
            raise


def _refusal(encode: Callable[..., Any], text: str) -> tuple[str | None, BaseException | None]:
    """Why the tokenizer refuses ``text`` on its own, and its error; (None, None) if it does
    not."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        what = f"{error.reason} ({text[error.start]!r}) at character {error.start}"
        return f"is not valid Unicode text: {what}", None
    try:
        encode([text], add_special_tokens=False)
    except Exception as error:  # tokenizers raises bare Exceptions
        return f"cannot be encoded by the tokenizer: {error}", error
    return None, None


class OperatorClock:
    """Seconds spent and documents out per operator of a chain, added once per chunk from any
    thread; picklable (the lock is made anew)."""

    def __init__(self, names: Iterable[str]) -> None:
        self._names = list(names)
        self._lock = threading.Lock()
        self.seconds = dict.fromkeys(self._names, 0.0)
        self.documents = dict.fromkeys(self._names, 0)

    def record(self, marks: list[tuple[int, float]]) -> None:
        """Add one chunk's (documents, seconds) per operator, in the order of the names."""
        with self._lock:  # one update per chunk: cheap enough to leave on
            for name, (count, seconds) in zip(self._names, marks):
                self.seconds[name] += seconds
                self.documents[name] += count

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
