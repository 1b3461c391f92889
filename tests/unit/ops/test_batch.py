"""A micro-batch from packed rows: pieces copied into place, padding after each row and for
missing rows, trainable masks aligned with the tokens."""

from __future__ import annotations

import numpy as np
from torchdata.nodes import BaseNode

from zephon_torch.ops.batch import BatchNode
from zephon_torch.ops.pack import PackedRow


class _Rows(BaseNode[PackedRow]):
    def __init__(self, rows: list[PackedRow]) -> None:
        super().__init__()
        self.rows = rows

    def reset(self, initial_state: dict[str, object] | None = None) -> None:
        super().reset(initial_state)
        self.at = 0

    def get_state(self) -> dict[str, object]:
        return {"at": self.at}

    def next(self) -> PackedRow:
        if self.at == len(self.rows):
            raise StopIteration
        self.at += 1
        return self.rows[self.at - 1]


def _row(*parts: list[int], trainable: list[bool] | None = None) -> PackedRow:
    arrays = [np.asarray(p, dtype=np.uint16 if i % 2 else np.int32) for i, p in enumerate(parts)]
    return PackedRow(
        parts=arrays,
        lengths=[len(p) for p in parts],
        sources=[0] * len(parts),
        starts_document=[True] * len(parts),
        trainable=None if trainable is None else np.asarray(trainable),
    )


def test_rows_of_several_pieces_are_padded_in_place_and_missing_rows_are_all_padding() -> None:
    rows = [
        _row([1, 2], [3], [4, 5]),
        _row([6, 7, 8, 9, 10, 11]),
        _row([12], trainable=[False]),
    ]
    node = BatchNode(
        _Rows(rows), microbatch_size=4, max_length=6, lane=0, pad_id=99, source_names=["s"]
    )
    node.reset()
    batch = next(node)
    assert batch.input_ids.dtype == np.int64
    assert batch.input_ids.tolist() == [
        [1, 2, 3, 4, 5, 99],
        [6, 7, 8, 9, 10, 11],
        [12, 99, 99, 99, 99, 99],
        [99] * 6,
    ]
    assert batch.lengths == [[2, 1, 2], [6], [1], []]
    assert batch.num_tokens == 12
    assert batch.trainable is not None
    assert batch.trainable.tolist() == [[True] * 6, [True] * 6, [False] + [True] * 5, [True] * 6]
    assert next(node).input_ids.tolist() == [[99] * 6] * 4  # the lane is spent
