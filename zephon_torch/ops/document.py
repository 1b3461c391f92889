"""The unit that flows through per-document operators, and the stateless operator protocol.

Per-document operators (fetch, map, filter, tokenize) are pure functions over a list of
documents. They are fused into one chain that an in-order parallel mapper runs on chunks, so
their cost is paid on worker threads or processes, never on the packer's thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from zephon_torch.errors import DataError

Tokens = npt.NDArray[np.integer[Any]]  # int32 from tokenizers; stored type when pre-tokenized


@dataclass(slots=True)
class Document:
    """One document of one source in one lane.

    ``pass_index`` and ``pos`` locate it in its lane's pointer stream, which is all a state needs
    to find it again; ``shard`` and ``row`` locate it in storage for error messages.
    ``trainable`` (chat data) marks, per token, whether it is a loss target; None: all are.
    ``payload`` holds row fields kept whole for ``pack_sequences`` (image bytes, arrays).
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


class DocOp(Protocol):
    """A stateless per-document operator: documents in, documents out (fewer if filtering)."""

    def __call__(self, docs: list[Document]) -> list[Document]: ...

    def fingerprint(self) -> dict[str, Any]:
        """Its data-affecting parameters, JSON-able."""
        ...


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
