"""How far each (lane, source) reader reads ahead: in proportion to its source's share."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from zephon_torch import Pipeline
from zephon_torch.io import Dataset
from zephon_torch.ops.estimate import DEFAULT_CHUNK_DOCS
from zephon_torch.work import StaticMixtureWorkSource


def counted_read(count: itertools.count[int], row: dict[str, Any]) -> dict[str, Any]:
    next(count)
    return row


def test_a_lane_of_many_sources_reads_about_one_chunk_ahead_of_each_small_one() -> None:
    """Every reader kept its full read-ahead whatever its share, so a lane's grew with the
    number of sources: each source, once first due, had 15 chunks read, here all 38,400
    documents for the 384 the first 12 micro-batches hold; 300 sources on 8 lanes read
    every document four times over in 20 steps, 18 times as slow as 10 sources."""
    sources, rows = 64, 600
    datasets = [
        Dataset.from_dict(
            f"s{d:02d}", {"ids": [np.full(3, d + 1, dtype=np.int32)] * rows}, shard_size=50
        )
        for d in range(sources)
    ]
    count = itertools.count()
    pipeline = (
        Pipeline(StaticMixtureWorkSource(datasets, seed=1, exhaustion="repeat"))
        .map(lambda row: counted_read(count, row), name="count")
        .pretokenized("ids", eos_token_id=0, runner="inline")  # read when submitted
        .pack_flat(64)
        .batch(2)
    )
    delivered: set[str] = set()
    documents = 0
    for batch in itertools.islice(pipeline, 12):
        begun = batch.documents_by_source()
        documents += sum(begun.values())
        delivered |= {name for name, n in begun.items() if n}
    assert len(delivered) == sources  # every reader has started
    read = next(count)
    # the chunk being taken and one more in flight, of DEFAULT_CHUNK_DOCS, for each source
    assert read <= documents + sources * 2 * DEFAULT_CHUNK_DOCS, read


def test_a_source_of_a_quarter_or_more_keeps_the_full_read_ahead() -> None:
    datasets = [
        Dataset.from_dict(name, {"ids": [np.full(3, 1, dtype=np.int32)] * 4000})
        for name in ("big", "small")
    ]
    source = StaticMixtureWorkSource(datasets, {"big": 0.75, "small": 0.25}, seed=1)
    pipeline = Pipeline(source).pretokenized("ids", eos_token_id=0).pack_flat(64).batch(2)
    next(iter(pipeline))
    assert pipeline._runtime is not None
    big, small = pipeline._runtime.readers
    assert (big.ahead, big._growth) == (small.ahead, small._growth) == (4, 8)
