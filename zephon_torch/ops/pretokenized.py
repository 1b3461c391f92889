"""Pre-tokenized input: a row field already holds token ids, so no tokenizer runs.

Accepts a 1-D integer numpy array (MDS/LitData token columns) or a list of ints (JSON, Parquet
list columns); ids are checked to be non-negative integers that fit int32.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from zephon_torch.ops.document import Document, document_error


class TokenFieldOp:
    """Take each document's tokens from ``field``, optionally appending an EOS id.

    Args:
        field: the row field holding token ids.
        eos_token_id: appended to every document when set (for data stored without one).
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
        for doc in docs:
            data = doc.data if doc.data is not None else {}
            value = data.get(self.field)
            try:
                tokens = value if type(value) is np.ndarray else np.asarray(value)
                if tokens.ndim != 1 or (tokens.size and tokens.dtype.kind not in "iu"):
                    raise TypeError(f"got {type(value).__name__} of shape {tokens.shape}")
                if tokens.size and not _in_range(tokens):
                    raise TypeError("ids must lie in [0, 2**31)")
            except (TypeError, ValueError) as exc:
                message = (
                    f"field {self.field!r} is missing; the row has fields {sorted(data)}"
                    if self.field not in data
                    else f"field {self.field!r} must hold a 1-D list of token ids: {exc}"
                )
                raise document_error(
                    doc, message, dataset_names=self.dataset_names, shard_paths=self.shard_paths
                ) from None
            tokens = tokens.astype(np.int32, copy=False)
            if self.eos_token_id is not None:
                tokens = np.append(tokens, np.int32(self.eos_token_id))
            doc.tokens = tokens
            if not self.keep_data:
                doc.data = None
        return docs

    def fingerprint(self) -> dict[str, Any]:
        """Field and EOS policy."""
        return {"kind": "pretokenized", "field": self.field, "eos_token_id": self.eos_token_id}


_INT32_MAX = int(np.iinfo(np.int32).max)
_minimum, _maximum = np.minimum.reduce, np.maximum.reduce


def _in_range(tokens: np.ndarray[Any, Any]) -> bool:
    """Whether every id lies in [0, 2**31), with as few passes as the dtype allows."""
    kind, size = tokens.dtype.kind, tokens.dtype.itemsize
    if kind == "u" and size <= 2:
        return True
    if kind == "i" and size <= 4:
        return bool(_minimum(tokens) >= 0)  # the ufunc itself: no Python wrapper per document
    return bool(_minimum(tokens) >= 0 and _maximum(tokens) <= _INT32_MAX)
