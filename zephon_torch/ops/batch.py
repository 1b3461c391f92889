"""Batch: ``microbatch_size`` packed rows of one lane, padded to ``[B, S]``, with their layout.

A ``Batch`` keeps numpy arrays and the segment layout; ``to_training()`` builds the tensors a
training step consumes. The lane's state after the batch travels with it, so whoever delivers
the batch to the training loop can record exactly what was delivered.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torchdata.nodes import BaseNode

from zephon_torch.ops.pack import MixPack, PackedRow, RowBlock
from zephon_torch.ops.packers import WrapPacker
from zephon_torch.ops.pretokenized import IdCheck
from zephon_torch.ops.training import training_tensors


@dataclass
class Batch:
    """One lane's micro-batch.

    Attributes:
        input_ids: ``[B, S]`` int64 tokens, padding filled with ``pad_id``.
        lengths: per row, the lengths of its segments (document pieces), in order.
        sources: per row, each segment's source index.
        starts_document: per row, whether each segment begins its document.
        source_names: source index to dataset name.
        payloads: with ``pack_sequences``, per row, each segment's kept fields, untouched.
        lane: the canonical lane that produced it.
        turn: the lane's micro-batch counter (the global step in turns).
        state: the lane's state right after this batch.
    """

    input_ids: npt.NDArray[np.int64]
    lengths: list[list[int]]
    sources: list[list[int]]
    starts_document: list[list[bool]]
    source_names: list[str]
    lane: int
    turn: int
    pad_id: int
    state: dict[str, Any] = field(repr=False)
    trainable: npt.NDArray[np.bool_] | None = field(default=None, repr=False)
    payloads: list[list[dict[str, Any]]] | None = field(default=None, repr=False)
    _num_tokens: int | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def num_tokens(self) -> int:
        """Real (non-padding) tokens in the batch."""
        if self._num_tokens is None:
            self._num_tokens = sum(map(sum, self.lengths))
        return self._num_tokens

    def tokens_by_source(self) -> dict[str, int]:
        """Real tokens per dataset name."""
        names = self.source_names
        if len(names) == 1:
            return {names[0]: self.num_tokens}
        out = dict.fromkeys(names, 0)
        for lengths, sources in zip(self.lengths, self.sources):
            for n, s in zip(lengths, sources):
                out[names[s]] += n
        return out

    def to(self, device: torch.device | str, **options: bool) -> dict[str, torch.Tensor]:
        """``to_training(**options)`` on ``device``: pinned and copied without blocking to an
        accelerator."""
        target = torch.device(device)
        out = self.to_training(**options)
        if target.type == "cpu":
            return out
        return {k: v.pin_memory().to(target, non_blocking=True) for k, v in out.items()}

    def to_training(
        self, *, mask_document_boundaries: bool = False, attention_mask: bool = False
    ) -> dict[str, torch.Tensor]:
        """The tensors of a training step; see ``zephon_torch.ops.training.training_tensors``
        for each one (``input_ids``, ``labels``, ``loss_mask``, ``position_ids``,
        ``document_ids``, ``source_ids``, ``cu_seqlens``, ``max_seqlen``, ``num_valid_tokens``,
        and with ``attention_mask=True`` the block-diagonal causal mask)."""
        return training_tensors(
            self.input_ids,
            self.lengths,
            self.sources,
            trainable=self.trainable,
            mask_document_boundaries=mask_document_boundaries,
            attention_mask=attention_mask,
        )

    def row_sources(self) -> list[list[str]]:
        """Per row, the dataset name of each of its segments."""
        return [[self.source_names[s] for s in row] for row in self.sources]


class BatchNode(BaseNode[Batch]):
    """Group ``microbatch_size`` rows of one lane into a padded ``Batch``.

    After the lane's rows run out, the last batch is padded with empty rows, and every later
    batch is all padding (``num_tokens == 0``): the scheduler decides when the stream ends.

    State:
        ``{"turn": int, "done": bool, "pack": the row source's state}``.

    Resume guarantee: exact (states are taken between batches, where no row is held).
    """

    def __init__(
        self,
        source: BaseNode[PackedRow],
        *,
        microbatch_size: int,
        max_length: int,
        lane: int,
        pad_id: int,
        source_names: list[str],
        plain: bool = False,
        id_check: IdCheck | None = None,
    ) -> None:
        super().__init__()
        self.source = source
        self.microbatch_size = microbatch_size
        self.max_length = max_length
        self.lane = lane
        self.pad_id = pad_id
        self.source_names = source_names
        self.id_check = id_check  # pre-tokenized data: every batch's ids are checked
        self.turn = 0
        self.done = False
        self._padding = np.full(max_length, pad_id, dtype=np.int64)  # sliced, never written
        # wrap rows of plain documents come as one block per batch (see MixPack.wrap_rows)
        self._blocks = (
            plain and isinstance(source, MixPack) and isinstance(source.packer, WrapPacker)
        )

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        """Start fresh or at a saved turn."""
        super().reset(initial_state)
        if initial_state is None:
            self.turn, self.done = 0, False
            self.source.reset(None)
        else:
            self.turn, self.done = initial_state["turn"], initial_state["done"]
            self.source.reset(initial_state["pack"])

    def get_state(self) -> dict[str, Any]:
        """Turn counter, end flag and the packer's state."""
        return {"turn": self.turn, "done": self.done, "pack": self.source.get_state()}

    def next(self) -> Batch:
        """The lane's next micro-batch; once the lane is spent, all-padding batches."""
        if self._blocks:
            assert isinstance(self.source, MixPack)
            if self.done:
                block = RowBlock([], [], [], [], 0)
            else:
                block = self.source.wrap_rows(self.microbatch_size)
                # as row by row: done once a row was asked for and none came
                self.done = len(block.lengths) < self.microbatch_size
            batch = self.assemble(block, filled=block.tokens)
        else:
            rows: list[PackedRow] = []
            source = self.source
            while not self.done and len(rows) < self.microbatch_size:
                try:
                    rows.append(source.next())  # reset by our reset(): skip BaseNode's check
                except StopIteration:
                    self.done = True
            batch = self.pad_rows(rows)
        self.turn += 1
        batch.state = self.get_state()
        return batch

    def pad_rows(self, rows: list[PackedRow]) -> Batch:
        """``rows`` padded to ``[microbatch_size, max_length]`` (no rows: all padding)."""
        padding = self._padding
        width = self.max_length
        block = RowBlock([], [], [], [], 0)
        chat = with_payload = False
        for row in rows:  # each row's pieces, then its padding: one copy into the batch
            block.parts.extend(row.parts)
            block.owners.extend(row.owners)
            length = sum(row.lengths)
            if length < width:
                block.parts.append(padding[: width - length])
                block.owners.append(None)
            block.tokens += length
            block.lengths.append(row.lengths)
            block.sources.append(row.sources)
            block.starts_document.append(row.starts_document)
            if row.trainable is not None:
                chat = True
            if row.payloads is not None:
                with_payload = True
        batch = self.assemble(block, filled=len(rows) * width)
        if chat:
            batch.trainable = np.ones(batch.input_ids.shape, dtype=bool)
            for r, row in enumerate(rows):
                if row.trainable is not None:
                    batch.trainable[r, : row.length] = row.trainable
        if with_payload:
            empty = self.microbatch_size - len(rows)
            batch.payloads = [row.payloads or [] for row in rows] + [[] for _ in range(empty)]
        return batch

    def assemble(self, block: RowBlock, *, filled: int) -> Batch:
        """The batch of ``block``, whose parts lay out its rows end to end over ``filled``
        positions: the rest of the last row and the missing rows are padding, and everything
        is copied into the ``[microbatch_size, max_length]`` buffer at once."""
        parts = block.parts
        rest = -filled % self.max_length
        if rest:
            parts.append(self._padding[:rest])
        empty = self.microbatch_size - len(block.lengths)
        if empty:
            parts.extend([self._padding] * empty)
            for out in (block.lengths, block.sources, block.starts_document):
                out.extend([] for _ in range(empty))
        ids = np.empty((self.microbatch_size, self.max_length), dtype=np.int64)
        np.concatenate(parts, out=ids.reshape(-1))
        if self.id_check is not None:
            self.id_check.check(ids, parts, block.owners)
        batch = Batch(
            input_ids=ids,
            lengths=block.lengths,
            sources=block.sources,
            starts_document=block.starts_document,
            source_names=self.source_names,
            lane=self.lane,
            turn=self.turn,
            pad_id=self.pad_id,
            state={},
        )
        batch._num_tokens = block.tokens  # known here: not summed again per delivery
        return batch
