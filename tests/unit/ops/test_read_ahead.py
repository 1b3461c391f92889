"""How far each (lane, source) reader reads ahead: in proportion to its source's share."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

from zephon_torch import Pipeline
from zephon_torch.errors import ZephonWarning
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


def test_a_small_source_left_alone_reads_fully_ahead_and_so_does_its_resume() -> None:
    """Once the other sources are spent (exhaustion="stop"), a small source is the whole lane:
    it kept the read-ahead of its 1% share, one chunk in flight, to the end of the run."""
    datasets = [
        Dataset.from_dict("big", {"ids": [np.full(3, 1, dtype=np.int32)] * 40}),
        Dataset.from_dict("small", {"ids": [np.full(3, 2, dtype=np.int32)] * 4000}),
    ]

    def pipeline() -> Pipeline:
        source = StaticMixtureWorkSource(
            datasets, {"big": 0.99, "small": 0.01}, seed=1, exhaustion="stop"
        )
        return (
            Pipeline(source)
            .options(canonical_replicas=1)
            .pretokenized("ids", eos_token_id=0)
            .pack_flat(64)
            .batch(2)
        )

    run = pipeline()
    batches = iter(run)
    next(batches)
    assert run._runtime is not None
    small = run._runtime.readers[1]
    assert (small.ahead, small._growth) == (1, 1)  # 1% of the mixture
    state = None
    with pytest.warns(ZephonWarning, match="'big' ran out"):
        for batch in batches:
            if batch.documents_by_source().get("big", 0) == 0:  # big is spent
                state = run.state_dict()
                break
    assert state is not None and (small.ahead, small._growth) == (4, 8)
    resumed = pipeline()
    resumed.load_state_dict(state)
    next(iter(resumed))
    assert resumed._runtime is not None
    assert (resumed._runtime.readers[1].ahead, resumed._runtime.readers[1]._growth) == (4, 8)
