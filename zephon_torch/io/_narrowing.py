"""Narrowed reading that falls back to whole rows shard by shard, for recipes that skip bad
rows (``bad_rows="skip"``).

A narrowed dataset (`Dataset.reading`) checks at a shard's open that the shard holds the
fields read, and a token column lists of integers: a `ColumnMismatch`, the shard's fault. Where
bad rows are skipped, that would end the run, though read whole each of the shard's rows is a
row's fault (its field missing, or no token ids), skipped and counted. `NarrowedOrWhole` reads
narrowed, and a shard whose open finds a mismatch whole from then on: every row comes as the
whole read gives it, so batches, skips and states are those of a recipe read whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from zephon_torch.io._projection import ColumnMismatch
from zephon_torch.io._rows import Rows, TokenIds
from zephon_torch.io.dataset import Dataset


class NarrowedOrWhole(Dataset):
    """``narrowed`` (``whole.reading(...)``, the same shards), each shard read through
    ``whole`` from its first `ColumnMismatch` on."""

    def __init__(self, narrowed: Dataset, whole: Dataset) -> None:
        super().__init__(
            name=narrowed.name,
            format=narrowed.format,
            shards=narrowed.shards,
            reader=narrowed._reader,
            revision=narrowed.revision,
        )
        self.whole = whole
        self._whole_shards: set[int] = set()  # read whole (an add is atomic: thread-safe)

    def read_rows(self, shard: int, rows: Rows) -> list[dict[str, Any]]:
        if shard not in self._whole_shards:
            try:
                return super().read_rows(shard, rows)
            except ColumnMismatch:
                self._whole_shards.add(shard)
        return self.whole.read_rows(shard, rows)

    def read_tokens(self, shard: int, rows: Rows, field: str) -> Sequence[TokenIds] | None:
        if shard not in self._whole_shards:
            try:
                return super().read_tokens(shard, rows, field)
            except ColumnMismatch:
                self._whole_shards.add(shard)
        return self.whole.read_tokens(shard, rows, field)

    def maps_token_ids(self) -> bool:
        return super().maps_token_ids() and self.whole.maps_token_ids()

    def cache_counters(self) -> dict[str, int] | None:
        """Both readers' counters, summed (None: not remote)."""
        counted = [c for c in (super().cache_counters(), self.whole.cache_counters()) if c]
        if not counted:
            return None
        return {key: sum(c.get(key, 0) for c in counted) for key in counted[0]}
