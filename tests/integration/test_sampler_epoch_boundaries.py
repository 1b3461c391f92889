"""ElasticDistributedSampler under StatefulDataLoader at epoch boundaries, with and without
workers: a loop checkpointed after any batch, after an epoch's loop ended, or after the next
set_epoch, resumes with exactly the rest of the uninterrupted run.

With workers the loader draws indices as soon as its iterator exists; a state at an epoch's end
then lost its resume point to that prefetch, and the finished epoch was trained again.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest
from torch.utils.data import Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from zephon_torch.elastic import ElasticDistributedSampler

N, G, EPOCHS = 12, 4, 2  # three steps per epoch


class IndexDataset(Dataset[int]):
    """Each sample is its own index."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, index: int) -> int:
        return index


Checkpoint = tuple[int, dict[str, Any]]  # (batches trained before it, {"epoch", "loader"})


def train(
    num_workers: int,
    checkpoint: dict[str, Any] | None = None,
    saves: list[Checkpoint] | None = None,
) -> list[list[int]]:
    """A plain epoch loop; it resumes at the checkpoint's epoch, and into ``saves`` it records a
    checkpoint after each set_epoch, after each batch and after each epoch's loop."""
    sampler = ElasticDistributedSampler(IndexDataset(), num_replicas=1, rank=0, global_batch_size=G)
    with warnings.catch_warnings():  # it calls the deprecated torch.set_vital
        warnings.simplefilter("ignore", UserWarning)
        loader = StatefulDataLoader(
            IndexDataset(), batch_size=G, sampler=sampler, num_workers=num_workers
        )
    seen: list[list[int]] = []

    def save(epoch: int) -> None:
        if saves is not None:
            state = json.loads(json.dumps(loader.state_dict()))
            saves.append((len(seen), {"epoch": epoch, "loader": state}))

    start = 0
    if checkpoint is not None:
        start = checkpoint["epoch"]
        loader.load_state_dict(checkpoint["loader"])
    for epoch in range(start, EPOCHS):
        sampler.set_epoch(epoch)
        save(epoch)
        for batch in loader:
            seen.append(batch.tolist())
            save(epoch)
        save(epoch)
    return seen


@pytest.fixture(scope="module")
def uninterrupted() -> list[list[int]]:
    seen = train(0)
    assert len(seen) == EPOCHS * N // G
    assert seen[:3] != seen[3:]  # epochs shuffle differently
    return seen


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_loop_resumed_from_any_checkpoint_of_two_epochs_trains_exactly_the_rest(
    num_workers: int, uninterrupted: list[list[int]]
) -> None:
    saves: list[Checkpoint] = []
    assert train(num_workers, saves=saves) == uninterrupted
    assert len(saves) == EPOCHS * (N // G + 2)
    for trained, checkpoint in saves:
        resumed = train(num_workers, checkpoint)
        assert resumed == uninterrupted[trained:], (trained, checkpoint["epoch"])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_lightnings_order_after_an_epochs_last_batch_trains_the_next_epoch(
    num_workers: int, uninterrupted: list[list[int]]
) -> None:
    """Lightning loads the state, makes the loader's iterator (its workers draw at once), and
    only then calls set_epoch(1) and trains from that iterator: it got no batch at all."""
    saves: list[Checkpoint] = []
    train(num_workers, saves=saves)
    # the checkpoint right after epoch 0's last batch, before the loop saw the epoch end
    state = next(c["loader"] for trained, c in saves if trained == 3)
    sampler = ElasticDistributedSampler(IndexDataset(), num_replicas=1, rank=0, global_batch_size=G)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        loader = StatefulDataLoader(
            IndexDataset(), batch_size=G, sampler=sampler, num_workers=num_workers
        )
    loader.load_state_dict(state)
    batches = iter(loader)
    sampler.set_epoch(1)
    assert [batch.tolist() for batch in batches] == uninterrupted[3:]
