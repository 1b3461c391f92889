"""``read_span``: rows behind (shard, row) pairs come back in the order asked, each shard read
once, the shards in the order the stream first needs them."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_torch.io import Dataset
from zephon_torch.ops.fetch import read_span

SHARDS, SHARD_ROWS = 4, 5


class CountingDataset:
    """A dataset whose ``read_rows`` calls are recorded."""

    def __init__(self) -> None:
        rows = [{"id": i} for i in range(SHARDS * SHARD_ROWS)]
        self.dataset = Dataset.from_dict("d", rows, shard_size=SHARD_ROWS)
        self.calls: list[tuple[int, list[int]]] = []

    def read_rows(self, shard: int, rows: Any) -> list[dict[str, Any]]:
        self.calls.append((shard, list(np.asarray(rows).tolist())))
        return self.dataset.read_rows(shard, rows)


@settings(max_examples=300, deadline=None)
@given(
    pairs=st.lists(
        st.tuples(st.integers(0, SHARDS - 1), st.integers(0, SHARD_ROWS - 1)), max_size=30
    )
)
def test_rows_come_in_the_order_asked_each_shard_read_once_in_first_need_order(
    pairs: list[tuple[int, int]],
) -> None:
    counting = CountingDataset()
    shards = np.asarray([s for s, _ in pairs], dtype=np.int64)
    rows = np.asarray([r for _, r in pairs], dtype=np.int64)
    got = read_span(counting, shards, rows)  # type: ignore[arg-type]
    assert [row["id"] for row in got] == [s * SHARD_ROWS + r for s, r in pairs]
    first_need = list(dict.fromkeys(s for s, _ in pairs))
    assert [shard for shard, _ in counting.calls] == first_need
    for shard, asked in counting.calls:  # a shard's rows in stream order
        assert asked == [r for s, r in pairs if s == shard]
