"""Operators: per-document stateless ops fused on a parallel runner, stateful nodes per lane."""

from zephon_torch.ops.batch import IGNORE_INDEX, Batch, BatchNode
from zephon_torch.ops.document import DocOp, Document
from zephon_torch.ops.pack import MixPack, PackedRow
from zephon_torch.ops.read import DocumentReader

__all__ = [
    "IGNORE_INDEX",
    "Batch",
    "BatchNode",
    "DocOp",
    "Document",
    "DocumentReader",
    "MixPack",
    "PackedRow",
]
