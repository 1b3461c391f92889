"""Datasets: named lists of shards with row counts, read row by row on demand."""

from __future__ import annotations

from zephon_torch.io._shards import Shard
from zephon_torch.io.dataset import Dataset

__all__ = ["Dataset", "Shard"]
