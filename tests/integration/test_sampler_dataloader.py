"""ElasticDistributedSampler under real DataLoaders: the same global batches at W = 1, 2, 4.

Ranks are simulated by building one loader per rank with explicit ``rank``/``num_replicas``;
a step's global batch is the ranks' batches concatenated in rank order.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterable
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from zephon_torch.elastic import ElasticDistributedSampler

N, G, SEED, EPOCH = 37, 8, 5, 1  # 37 samples: 4 full global batches and one padded with 3
K = 2  # steps taken before the state of a mid-epoch resume


class IndexDataset(Dataset[int]):
    """Map-style dataset whose sample is its own index; module-level so spawn can pickle it."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> int:
        return index


def loader(
    world: int,
    rank: int,
    *,
    num_workers: int = 0,
    state: dict[str, Any] | None = None,
    stateful: bool = False,
) -> tuple[ElasticDistributedSampler, Any]:
    """Rank ``rank`` of ``world``'s sampler and its (Stateful)DataLoader of ``G / world``."""
    sampler = ElasticDistributedSampler(
        IndexDataset(), num_replicas=world, rank=rank, seed=SEED, global_batch_size=G
    )
    sampler.set_epoch(EPOCH)
    if state is not None:
        sampler.load_state_dict(state)
    workers: dict[str, Any] = {"num_workers": num_workers}
    if num_workers:
        workers["multiprocessing_context"] = "spawn"
    if not stateful:
        return sampler, DataLoader(
            IndexDataset(), batch_size=G // world, sampler=sampler, **workers
        )
    with warnings.catch_warnings():  # it calls the deprecated torch.set_vital
        warnings.simplefilter("ignore", UserWarning)
        return sampler, StatefulDataLoader(
            IndexDataset(), batch_size=G // world, sampler=sampler, **workers
        )


def global_batches(per_rank: Iterable[tuple[torch.Tensor, ...]]) -> list[list[int]]:
    """One entry per step: the ranks' batches of that step, concatenated in rank order."""
    return [torch.cat(batches).tolist() for batches in per_rank]


def run(world: int, **kw: Any) -> list[list[int]]:
    return global_batches(zip(*(loader(world, r, **kw)[1] for r in range(world))))


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    steps = run(1)
    assert len(steps) == 5 and all(len(step) == G for step in steps)
    assert sorted({i for step in steps for i in step}) == list(range(N))
    return steps


@pytest.mark.parametrize("world", [2, 4])
def test_every_world_size_loads_the_same_global_batches(
    world: int, reference: list[list[int]]
) -> None:
    assert run(world) == reference


@pytest.mark.parametrize(("before", "after"), [(1, 4), (4, 2), (2, 1)])
@pytest.mark.parametrize("k", [0, 2, 5])
def test_a_mid_epoch_resume_on_another_world_size_continues_the_same_global_batches(
    before: int, after: int, k: int, reference: list[list[int]]
) -> None:
    samplers, loaders = zip(*(loader(before, r) for r in range(before)))
    assert global_batches(batches for _, batches in zip(range(k), zip(*loaders))) == reference[:k]
    states = [s.state_dict(consumed_global_batches=k) for s in samplers]
    # With num_workers=0 nothing is prefetched: what the sampler yielded is what was consumed.
    assert [s.state_dict() for s in samplers] == states
    state = json.loads(json.dumps(states[0]))
    assert run(after, state=state) == reference[k:]


@pytest.mark.parametrize("k", [0, 1, 3, 5])
def test_stateful_dataloader_state_resumes_exactly_on_another_world_size(
    k: int, reference: list[list[int]]
) -> None:
    _, first = loader(2, 0, stateful=True)
    iterator = iter(first)
    assert [next(iterator).tolist() for _ in range(k)] == [s[: G // 2] for s in reference[:k]]
    # StatefulDataLoader asks the sampler for state_dict() with no argument, nests it in its own
    # state and hands it back to load_state_dict() at the resumed loader's first iter().
    state = json.loads(json.dumps(first.state_dict()))
    _, resumed = loader(1, 0, stateful=True)  # rank 0 of W=2 resumes as the only rank of W=1
    resumed.load_state_dict(state)
    assert [batch.tolist() for batch in resumed] == reference[k:]


@pytest.mark.parametrize("exhausted", [False, True], ids=["after_last_batch", "after_stop"])
def test_a_stateful_dataloader_state_from_the_end_of_an_epoch_resumes_at_the_next_epoch(
    exhausted: bool,
) -> None:
    _, finished = loader(2, 1, stateful=True)
    iterator = iter(finished)
    assert len([next(iterator) for _ in range(5)]) == 5
    if exhausted:
        assert next(iterator, None) is None
    state = finished.state_dict()
    _, uninterrupted = loader(2, 1)
    uninterrupted.sampler.set_epoch(EPOCH + 1)
    next_epoch = [b.tolist() for b in uninterrupted]
    sampler, resumed = loader(2, 1, stateful=True)
    resumed.load_state_dict(state)
    if not exhausted:  # the resumed loader still owes the end of the epoch: an empty pass
        assert list(resumed) == []
    # After the loop's set_epoch, even though StatefulDataLoader applies the sampler state
    # only at the next iter(): a finished epoch's state leaves a later epoch alone.
    sampler.set_epoch(EPOCH + 1)
    assert [b.tolist() for b in resumed] == next_epoch


@pytest.fixture(scope="module")
def spawned(reference: list[list[int]]) -> dict[str, Any]:
    """W=2 with two spawned workers per rank: rank 0 a DataLoader, rank 1 a StatefulDataLoader.

    Stops after K steps to take states, then reads the rest of the epoch. Spawning costs about
    a second per worker, so the tests below share this one run.
    """
    (s0, plain), (s1, stateful) = (
        loader(2, 0, num_workers=2),
        loader(2, 1, num_workers=2, stateful=True),
    )
    iterators = [iter(plain), iter(stateful)]  # both ranks' workers start together
    head = global_batches(batches for _, batches in zip(range(K), zip(*iterators)))
    result = {
        "head": head,
        "yielded": [s0.state_dict(), s1.state_dict()],
        "step_count_state": json.loads(json.dumps(s0.state_dict(consumed_global_batches=K))),
        "loader_state": json.loads(json.dumps(stateful.state_dict())),
    }
    result["tail"] = global_batches(zip(*iterators))
    return result


@pytest.mark.slow
def test_spawned_workers_load_the_same_global_batches(
    spawned: dict[str, Any], reference: list[list[int]]
) -> None:
    assert spawned["head"] + spawned["tail"] == reference


@pytest.mark.slow
def test_a_step_count_state_resumes_prefetching_workers_on_another_world_size(
    spawned: dict[str, Any], reference: list[list[int]]
) -> None:
    # The workers prefetch: both samplers already handed out every index of the epoch, so only
    # the training loop's step count says what was consumed.
    assert [s["global_batches"] for s in spawned["yielded"]] == [5, 5]
    assert run(4, state=spawned["step_count_state"]) == reference[K:]


@pytest.mark.slow
def test_stateful_dataloader_state_is_exact_with_spawned_workers(
    spawned: dict[str, Any], reference: list[list[int]]
) -> None:
    # StatefulDataLoader snapshots the sampler when it sends a batch's indices to a worker and
    # returns the snapshot of the batch last handed out, so prefetching does not leak into it.
    main = spawned["loader_state"]["_snapshot"]["_main_snapshot"]
    assert main["_sampler_iter_state"]["sampler_state"] == spawned["step_count_state"]
    # Rank 1's loader state resumes rank 0 of W=1; the worker count must stay the same.
    _, resumed = loader(1, 0, num_workers=2, stateful=True)
    resumed.load_state_dict(spawned["loader_state"])
    assert [batch.tolist() for batch in resumed] == reference[K:]
