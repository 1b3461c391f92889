"""Operators: per-document stateless ops fused on a parallel runner, stateful nodes per lane."""

from zephon_torch.ops.batch import Batch, BatchNode
from zephon_torch.ops.document import DocOp, Document
from zephon_torch.ops.pack import MixPack, PackedRow
from zephon_torch.ops.read import DocumentReader
from zephon_torch.ops.training import IGNORE_INDEX

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
