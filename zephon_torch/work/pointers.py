"""Pure pointer streams: the p-th document of a dataset in a lane, as a function of names.

For pass k of dataset d, the shard order is a keyed permutation of the shards. A shard is one
block of rows, or, where its reader splits it (a Parquet shard too big to decode at once, see
``Shard.blocks``), several consecutive runs of rows, which follow one another in a keyed order
inside their shard. Consecutive groups of ``window_shards`` blocks (in that order) form windows
whose rows are permuted by a keyed Feistel permutation. The concatenated windows form the pass
order, and lane l of L takes positions l, l+L, l+2L, ... of it. So every row belongs to exactly
one lane per pass, a lane reads at most one or two windows at a time (bounded open shards and
decoded data, known ahead for prefetch), each shard is read over one stretch of the pass, and
nothing proportional to the row count is ever built: set-up is O(blocks) per pass. Where no
shard is split, blocks are shards.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from zephon_torch.work._hashing import mix64_inplace, stable_key, stable_keys
from zephon_torch.work._pass_cache import PassCache
from zephon_torch.work._permutation import permute, permute_runs


class Pointer(NamedTuple):
    """Where a document lives: its stream position in a lane and its (shard, row).

    A named tuple: a chunk builds one per document, so it is made at tuple cost."""

    pass_index: int
    pos: int
    shard: int
    row: int


@dataclass(frozen=True, slots=True)
class PointerSpan:
    """Consecutive lane positions ``pos, pos+1, ...`` of one pass, as columns: where each
    document lives. A chunk of pointers without an object per document."""

    pass_index: int
    pos: int
    shards: npt.NDArray[np.int64]
    rows: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return len(self.rows)

    def pointers(self) -> list[Pointer]:
        """One ``Pointer`` per document."""
        make, pass_index, pos = Pointer._make, self.pass_index, self.pos
        return [
            make((pass_index, pos + i, s, r))
            for i, (s, r) in enumerate(zip(self.shards.tolist(), self.rows.tolist()))
        ]


def lane_length(*, num_rows: int, lane: int, num_lanes: int) -> int:
    """How many documents of a pass of ``num_rows`` rows lane ``lane`` of ``num_lanes`` gets."""
    return max(0, (num_rows - lane + num_lanes - 1) // num_lanes)


@dataclass(frozen=True)
class _PassLayout:
    block_shards: npt.NDArray[np.int64]  # the shard of each block, in pass order
    block_rows: npt.NDArray[np.int64]  # each block's first row in its shard
    ordered_starts: npt.NDArray[np.int64]  # pass offset of each ordered block, plus the total
    window_starts: npt.NDArray[np.int64]  # pass offset of each window, plus the total


class PointerLayout:
    """Maps (pass, lane, position) to (shard, row) for one dataset; pure and cheap to copy.

    Args:
        name: the dataset's name; part of every key.
        shard_rows: row count of each shard.
        seed: the recipe seed.
        window_shards: blocks (shards, where none is split) whose rows are shuffled
            together; 1 shuffles within each block.
        shuffle: when False, rows come in storage order (shards in order, rows in order).
        shard_blocks: per shard, the row counts of its blocks where it is split, else empty
            (one block); all empty when omitted.
    """

    def __init__(
        self,
        *,
        name: str,
        shard_rows: tuple[int, ...],
        seed: int,
        window_shards: int,
        shuffle: bool,
        shard_blocks: tuple[tuple[int, ...], ...] = (),
    ) -> None:
        self.name = name
        self.shard_rows = shard_rows
        self.num_rows = sum(shard_rows)
        self.seed = seed
        self.window_shards = window_shards
        self.shuffle = shuffle
        if shard_blocks and len(shard_blocks) != len(shard_rows):
            raise ValueError(f"{len(shard_blocks)} block lists for {len(shard_rows)} shards")
        for rows, blocks in zip(shard_rows, shard_blocks):
            if blocks and (sum(blocks) != rows or min(blocks) < 1):
                raise ValueError(f"blocks {blocks} do not split a shard of {rows} rows")
        # unsplit shards are one block: the same layout as without blocks
        self.shard_blocks = shard_blocks if any(shard_blocks) else ()
        self._key = _LayoutKey((name, shard_rows, self.shard_blocks, seed, window_shards, shuffle))

    def pointers(
        self, *, pass_index: int, lane: int, num_lanes: int, start: int, count: int
    ) -> list[Pointer]:
        """Pointers for lane positions ``start .. start+count-1`` of pass ``pass_index``."""
        where = {"pass_index": pass_index, "lane": lane, "num_lanes": num_lanes}
        return self.span(**where, start=start, count=count).pointers()

    def span(
        self, *, pass_index: int, lane: int, num_lanes: int, start: int, count: int
    ) -> PointerSpan:
        """``pointers(...)`` as columns."""
        global_pos = np.arange(start, start + max(0, count), dtype=np.int64) * num_lanes + lane
        if count <= 0:
            return PointerSpan(pass_index, start, global_pos, global_pos)
        shards, rows = self._locate(pass_index, global_pos)
        return PointerSpan(pass_index, start, shards, rows)

    def upcoming_shards(
        self, *, pass_index: int, lane: int, num_lanes: int, start: int
    ) -> Iterator[int]:
        """The shards lane positions ``start, start+1, ...`` of pass ``pass_index`` read, in
        the order they are first needed: the current window's shards, then each later window's.

        A window's rows are permuted across its blocks, so all of them are needed from its
        first row on. Shards without rows are left out. Lazy: prefetch stops walking once its
        byte budget is spent.
        """
        if self.num_rows == 0:
            return
        layout = self._layout(pass_index)
        first = self.first_upcoming_block(
            pass_index=pass_index, lane=lane, num_lanes=num_lanes, start=start
        )
        previous = -1
        for shard in layout.block_shards[first:]:  # lazily; a shard's blocks are adjacent
            if shard != previous and self.shard_rows[shard]:
                yield int(shard)
            previous = shard

    def window_at(self, *, pass_index: int, lane: int, num_lanes: int, start: int) -> list[int]:
        """The shards of the window lane position ``start`` of pass ``pass_index`` reads from
        (all of them are needed at once; without shuffling, the block the position is in)."""
        if self.num_rows == 0:
            return []
        layout = self._layout(pass_index)
        first = self.first_upcoming_block(
            pass_index=pass_index, lane=lane, num_lanes=num_lanes, start=start
        )
        blocks = layout.block_shards[first : first + (self.window_shards if self.shuffle else 1)]
        return sorted({int(shard) for shard in blocks if self.shard_rows[shard]})

    def first_upcoming_block(
        self, *, pass_index: int, lane: int, num_lanes: int, start: int
    ) -> int:
        """Where ``upcoming_shards`` starts its walk (a block index; 0 without rows): positions
        with the same value have the same upcoming shards, so a caller can skip the walk."""
        if self.num_rows == 0:
            return 0
        layout = self._layout(pass_index)
        global_pos = min(start * num_lanes + lane, self.num_rows - 1)
        if self.shuffle:
            window = int(np.searchsorted(layout.window_starts, global_pos, side="right")) - 1
            return window * self.window_shards
        return int(np.searchsorted(layout.ordered_starts, global_pos, side="right")) - 1

    def _locate(
        self, pass_index: int, global_pos: npt.NDArray[np.int64]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        layout = self._layout(pass_index)
        offsets = global_pos
        if self.shuffle:
            window = np.searchsorted(layout.window_starts, global_pos, side="right") - 1
            # positions rise, so each window's are one run: only the windows present are
            # permuted (with many lanes and small shards, most windows in between hold none),
            # all in the same numpy passes (a call a window cost 70-150 us: most of the time
            # of a pass over shards of a few rows)
            firsts = np.flatnonzero(np.diff(window, prepend=-1))
            present = window[firsts]
            begins = layout.window_starts[present]
            sizes = layout.window_starts[present + 1] - begins
            keys = stable_keys((self.seed, self.name, pass_index, "window"), present.tolist())
            lengths = np.diff(firsts, append=len(window))
            starts = np.repeat(begins, lengths)
            offsets = starts + permute_runs(global_pos - starts, lengths, sizes, keys.tolist())
        ordered = np.searchsorted(layout.ordered_starts, offsets, side="right") - 1
        rows = offsets - layout.ordered_starts[ordered] + layout.block_rows[ordered]
        return layout.block_shards[ordered], rows

    def _layout(self, pass_index: int) -> _PassLayout:
        return _pass_layout(self._key, pass_index)


class _LayoutKey:
    """A layout's settings as a cache key that hashes its (long) shard tuples once, not at
    every lookup; pickled as its settings, so a process hashes them afresh."""

    __slots__ = ("_hash", "settings")

    def __init__(
        self,
        settings: tuple[str, tuple[int, ...], tuple[tuple[int, ...], ...], int, int, bool],
    ) -> None:
        self.settings = settings
        self._hash = hash(settings)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, _LayoutKey) and self.settings == other.settings)

    def __reduce__(self) -> tuple[type[_LayoutKey], tuple[Any, ...]]:
        return _LayoutKey, (self.settings,)


def _make_pass_layout(settings: Any, pass_index: int) -> _PassLayout:
    assert isinstance(settings, _LayoutKey)
    name, shard_rows, shard_blocks, seed, window_shards, shuffle = settings.settings
    num_shards = len(shard_rows)
    if shuffle:
        key = stable_key(seed, name, pass_index, "shards")
        order = permute(np.arange(num_shards), num_shards, key)
    else:
        order = np.arange(num_shards, dtype=np.int64)
    if shard_blocks:
        block_shards, block_rows, sizes = _ordered_blocks(
            order, shard_rows, shard_blocks, seed, name, pass_index, shuffle
        )
    else:
        block_shards, block_rows = order, np.zeros(num_shards, dtype=np.int64)
        sizes = np.asarray(shard_rows, dtype=np.int64)[order]
    ordered_starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    window_starts = ordered_starts[::window_shards]
    if window_starts[-1] != ordered_starts[-1]:
        window_starts = np.concatenate([window_starts, ordered_starts[-1:]])
    return _PassLayout(block_shards, block_rows, ordered_starts, window_starts)


# each dataset's 4 most recently used passes (lanes straddle one pass end, prefetch looks into
# the next pass): 4 x 24 B a shard block, where a plain LRU of 64 (dataset, pass) entries had
# held 64 past passes of one dataset; up to 2**23 blocks (about 200 MB, a layout's arrays
# weighed as 32 more) of up to 4,096 datasets, so that a mixture of hundreds keeps every
# layout it reads
_pass_layout: PassCache[_PassLayout] = PassCache(
    _make_pass_layout,
    passes=4,
    keys=4096,
    weigh=lambda layout: len(layout.block_shards) + 32,
    max_weight=1 << 23,
    min_keys=256,
)


def _ordered_blocks(
    order: npt.NDArray[np.int64],
    shard_rows: tuple[int, ...],
    shard_blocks: tuple[tuple[int, ...], ...],
    seed: int,
    name: str,
    pass_index: int,
    shuffle: bool,
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The blocks of the shards in ``order``, a split shard's in a keyed order of their own
    (stored order without shuffle): each block's shard, first row and row count.

    Vectorised over all blocks: each block of a shard draws a keyed 64-bit sort key (a
    bijective scramble of its shard and index, so no two tie), and one sort orders the blocks
    by their shard's place in ``order``, then by key.
    """
    counts = np.fromiter((len(b) or 1 for b in shard_blocks), np.int64, len(shard_blocks))
    sizes = np.fromiter(
        (n for rows, b in zip(shard_rows, shard_blocks) for n in (b or (rows,))),
        np.int64,
        int(counts.sum()),
    )
    shards = np.repeat(np.arange(len(shard_rows), dtype=np.int64), counts)
    first_block = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    within = np.arange(len(sizes), dtype=np.int64) - first_block[shards]
    starts = np.cumsum(sizes) - sizes  # each block's first row in the storage order
    firsts = starts - starts[first_block][shards]
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order), dtype=np.int64)
    if shuffle:
        scramble = (shards.astype(np.uint64) << np.uint64(32)) | within.astype(np.uint64)
        scramble ^= np.uint64(stable_key(seed, name, pass_index, "blocks"))
        mix64_inplace(scramble)
        picked = np.lexsort((scramble, rank[shards]))
    else:
        picked = np.lexsort((within, rank[shards]))
    return shards[picked], firsts[picked], sizes[picked]
