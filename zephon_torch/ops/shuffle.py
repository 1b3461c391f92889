"""Shuffle packed rows per lane in blocks of ``window``, with a small state and exact resume.

The node reads ``window`` rows, then emits them in the order of a keyed permutation of the
block (key: recipe seed, lane, block number), so every block, and so every pass, has its own
order, identical on every machine. Its state is the packer state at the start of the current
block plus how many of the block's rows were emitted: a few pointers, not a buffer of rows.

Resume guarantee: exact; a resume re-packs the current block (at most ``window`` rows).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torchdata.nodes import BaseNode

from zephon_torch._packed_rows import beneath_start
from zephon_torch._state import state_dict_of, state_int
from zephon_torch.errors import ConfigError, StateMismatchError
from zephon_torch.ops.pack import PackedRow
from zephon_torch.work._hashing import stable_key
from zephon_torch.work._permutation import permute


class ShuffleNode(BaseNode[PackedRow]):
    """Emit each block of ``window`` rows of ``source`` in a seeded order.

    Args:
        source: the lane's packed rows.
        window: rows per block.
        seed: the recipe seed.
        lane: the lane id (part of the key).

    State:
        ``{"block": int, "emitted": int, "start": source state at the block's start}``.
    """

    def __init__(self, source: BaseNode[PackedRow], *, window: int, seed: int, lane: int) -> None:
        super().__init__()
        if window < 1:
            raise ConfigError(f"`window` must be positive, got {window}")
        self.source = source
        self.window = window
        self.seed = seed
        self.lane = lane
        self.block_index = 0
        self.emitted = 0
        self.start: dict[str, Any] | None = None
        self.block: list[PackedRow] = []

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        """Start fresh, or re-pack the saved block and skip what it had emitted."""
        super().reset(initial_state)
        self.block = []
        if initial_state is None:
            self.source.reset(None)
            self.block_index, self.emitted, self.start = 0, 0, None
            return
        state = state_dict_of(initial_state, ("block", "emitted", "start"), "shuffle")
        self.block_index = state_int(state["block"], "shuffle block")
        self.emitted = state_int(state["emitted"], "shuffle emitted")
        # None would restart the lane's packing at the stream's start: no release writes it
        self.start = state_dict_of(state["start"], (), "shuffle start")
        try:
            self.source.reset(self.start)
        except StateMismatchError as error:  # named from the packer's state: it lies under start
            raise StateMismatchError(
                {beneath_start(key): value for key, value in error.mismatches.items()},
                error.note,
            ) from None
        if self.emitted:
            self._fill()
            # a state is saved mid-block only (between blocks, emitted is 0): a count at or
            # past the block's rows failed with an IndexError, or re-keyed the next block
            if self.emitted >= len(self.block):
                raise StateMismatchError(
                    {
                        "shuffle emitted": (
                            self.emitted,
                            f"below the rows of the block it counts ({len(self.block)})",
                        )
                    }
                )

    def get_state(self) -> dict[str, Any]:
        """The block number, rows emitted from it, and the source state at its start."""
        if not self.block or self.emitted == len(self.block):
            # between blocks: the next block starts where the source is now
            return {"block": self.block_index, "emitted": 0, "start": self.source.get_state()}
        return {"block": self.block_index, "emitted": self.emitted, "start": self.start}

    def next(self) -> PackedRow:
        """The next row in shuffled order; StopIteration when the source is spent."""
        if not self.block or self.emitted == len(self.block):
            self.emitted = 0
            self.start = self.source.get_state()
            self._fill()
            if not self.block:
                raise StopIteration
        row = self.block[self.emitted]
        self.emitted += 1
        if self.emitted == len(self.block):
            self.block_index += 1
        return row

    def _fill(self) -> None:
        rows: list[PackedRow] = []
        for row in self.source:
            rows.append(row)
            if len(rows) == self.window:
                break
        key = stable_key(self.seed, "shuffle", self.lane, self.block_index)
        order = permute(np.arange(len(rows)), len(rows), key)
        self.block = [rows[i] for i in order.tolist()]

    def fingerprint(self) -> dict[str, Any]:
        """The window: changing it changes the order."""
        return {"kind": "shuffle", "window": self.window}
