"""Fetch: pointers in, documents with their row dicts out, reading each shard once per chunk."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from zephon_torch.io import Dataset
from zephon_torch.ops.document import Document
from zephon_torch.work.pointers import Pointer


class FetchOp:
    """Read the rows behind pointers of one source.

    Args:
        datasets: the work source's datasets, by source index.
    """

    def __init__(self, datasets: tuple[Dataset, ...]) -> None:
        self.datasets = datasets

    def fetch(self, source: int, pointers: list[Pointer]) -> list[Document]:
        """Documents for ``pointers`` in order; rows of one shard are read in one call."""
        dataset = self.datasets[source]
        by_shard: dict[int, list[int]] = defaultdict(list)
        for i, p in enumerate(pointers):
            by_shard[p.shard].append(i)
        rows: list[dict[str, Any] | None] = [None] * len(pointers)
        for shard, indices in by_shard.items():
            read = dataset.read_rows(shard, [pointers[i].row for i in indices])
            for i, row in zip(indices, read):
                rows[i] = row
        return [
            Document(source, p.pass_index, p.pos, p.shard, p.row, row)
            for p, row in zip(pointers, rows)
        ]

    def fingerprint(self) -> dict[str, Any]:
        """Fetch has no data-affecting parameters of its own (datasets are fingerprinted)."""
        return {"kind": "fetch"}
