"""Pre-tokenized input: a row field already holds token ids, so no tokenizer runs.

Accepts a 1-D integer numpy array (MDS/LitData token columns, ``.npy`` files) or a list of ints
(JSON, Parquet list columns), kept in its stored integer type. Whether every id lies in
``[0, 2**31)`` is checked as the ids are copied into their batch (``ops._copy.fill``); where
numpy copies them, ``IdCheck`` reads the int64 buffer the batch was just copied into once,
instead of a second read of each document.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from zephon_torch.errors import DataError
from zephon_torch.io._projection import field_error, id_limit, token_ids
from zephon_torch.ops._copy import Part, as_arrays, part_dtype
from zephon_torch.ops.document import Document, document_error

_maximum = np.maximum.reduce
# ids of these types always fit int32 (and a vocabulary as large as their range)
_NARROW: frozenset[np.dtype[Any]] = frozenset({np.dtype(np.uint8), np.dtype(np.uint16)})


def with_eos(tokens: npt.NDArray[np.integer[Any]], eos_token_id: int) -> npt.NDArray[Any]:
    """A copy of ``tokens`` with the EOS id (in ``[0, 2**31)``) appended: in the stored type
    when it holds the id (32 and 64 bits always; uint16 ids stay uint16, whose batches need no
    id check), else int32. Callers leave an empty document empty (unless it carries a
    payload): a lone EOS would be trained on as a document, and a source of empty ones would
    fill its mixture share with EOS runs."""
    dtype = tokens.dtype
    if dtype.itemsize < 4 and eos_token_id > np.iinfo(dtype).max:
        dtype = np.dtype(np.int32)
    out = np.empty(len(tokens) + 1, dtype=dtype)
    out[:-1] = tokens
    out[-1] = eos_token_id
    return out


class IdOutOfRange(DataError):
    """A stored token id outside ``[0, vocab_size)`` (or ``2**31``): the sign of a vocabulary
    other than the data's, not of a bad row, so ``bad_rows="skip"`` never skips it (it would
    skip document after document) and its message does not offer it."""

    rows_fault = False


class TokenFieldOp:
    """Take each document's tokens from ``field``, optionally appending an EOS id.

    Args:
        field: the row field holding token ids.
        eos_token_id: appended to every non-empty document when set (for data stored without one).
        dataset_names: source index to dataset name, for error messages.
        shard_paths: per source, shard index to path, for error messages.
        keep_data: keep the row after taking its tokens.
    """

    def __init__(
        self,
        *,
        field: str,
        eos_token_id: int | None,
        dataset_names: list[str],
        shard_paths: list[list[str]],
        keep_data: bool = False,
    ) -> None:
        self.field = field
        self.eos_token_id = eos_token_id
        self.dataset_names = dataset_names
        self.shard_paths = shard_paths
        self.keep_data = keep_data

    def __call__(self, docs: list[Document]) -> list[Document]:
        field, eos = self.field, self.eos_token_id
        for doc in docs:
            data = doc.data if doc.data is not None else {}
            try:
                tokens = token_ids(data.get(field))
            except (TypeError, ValueError) as exc:
                raise document_error(
                    doc,
                    field_error(field, data, exc),
                    dataset_names=self.dataset_names,
                    shard_paths=self.shard_paths,
                ) from None
            if eos is not None and (len(tokens) or doc.payload is not None):
                tokens = with_eos(tokens, eos)
            doc.tokens = tokens
            if not self.keep_data:
                doc.data = None
        return docs

    def fingerprint(self) -> dict[str, Any]:
        """Field and EOS policy."""
        return {"kind": "pretokenized", "field": self.field, "eos_token_id": self.eos_token_id}


Owner = tuple[int, int, int]  # source, shard, row of a part of a batch


class IdCheck:
    """Checks the ids of each batch of pre-tokenized data (see ``check``).

    Args:
        field: the token field, for error messages.
        dataset_names: source index to dataset name.
        shard_paths: per source, shard index to path.
    """

    def __init__(
        self,
        field: str,
        dataset_names: list[str],
        shard_paths: list[list[str]],
        *,
        vocab_size: int | None = None,
    ) -> None:
        self.field = field
        self.dataset_names = dataset_names
        self.shard_paths = shard_paths
        self.limit, self.bound = id_limit(vocab_size)
        # stored types whose every value lies below the limit: their batches need no pass
        self.narrow = frozenset(d for d in _NARROW if (1 << 8 * d.itemsize) <= self.limit)

    def check(
        self,
        ids: npt.NDArray[np.int64],
        parts: Sequence[Part],
        owners: Sequence[Owner | None],
    ) -> None:
        """Raise ``DataError`` naming the document when an id of the batch ``ids`` lies
        outside ``[0, limit)`` (``2**31``, or the ``vocab_size`` given).

        Called where ``ops._copy.fill`` found such an id, or did not look. ``ids`` was filled
        with ``parts`` in order, the i-th owned by ``owners[i]`` (None:
        padding, which comes after the owned parts of its row). Copied into int64, any stored
        id that does not fit int32 (negative, too large, or an unsigned 64-bit id that wrapped
        around) reads above 2**31 - 1 as unsigned: one pass over a buffer still in cache. A
        batch whose every document is stored as uint8 or uint16 needs no pass (the pass takes
        about 5 us per [8, 2048] batch on a 2-core VM: a seventh of the batch's 35-45 us).
        """
        narrow, top = self.narrow, self.limit - 1
        for part, owner in zip(parts, owners):  # a span's dtype is its base's: no view made
            if owner is not None and part_dtype(part) not in narrow:
                break
        else:  # uint8 and uint16 ids always fit (below a vocabulary past their range)
            return
        flat = ids.reshape(-1).view(np.uint64)
        if _maximum(flat) <= top:
            return
        bad = int(np.flatnonzero(flat > top)[0])
        end = 0
        for part, owner in zip(as_arrays(parts), owners):
            end += len(part)
            if bad < end and owner is not None:
                value = int(part[bad - end + len(part)])
                source, shard, row = owner
                raise IdOutOfRange(
                    f"field {self.field!r} holds token id {value}; ids must lie in "
                    f"[0, {self.bound}) (a tokenizer or vocab_size other than the data's? "
                    "bad_rows='skip' does not skip ids out of range)",
                    dataset=self.dataset_names[source],
                    shard=self.shard_paths[source][shard],
                    row=row,
                )
        raise AssertionError("an id out of range in padding")  # pad ids are checked when set
