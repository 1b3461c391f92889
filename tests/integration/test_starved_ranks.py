"""A rank dealt no document: under exhaustion="repeat" (a stream that never ends) it pads on, as
its lanes do in one process, so its global batches are the one-process run's and no rank's
stream ends while the others go on (its training loop would hang in the next collective)."""

from __future__ import annotations

import warnings
from itertools import islice
from typing import Any

import pytest

from tests.helpers import key, keys, small_pipeline, two_sources
from zephon_torch.torch import DataLoader

L, W, STEPS = 8, 2, 3
DATASETS = two_sources(3, 2, shard_size=2)  # lanes 3 to 7 are dealt no document at all


def build(tokenizer: Any, **kw: Any) -> Any:
    with warnings.catch_warnings():  # fewer documents than lanes: warned of, on purpose here
        warnings.simplefilter("ignore")
        return small_pipeline(tokenizer, lanes=L, exhaustion="repeat", datasets=DATASETS, **kw)


def one_process_steps(tokenizer: Any) -> list[list[tuple[Any, ...]]]:
    """The one-process run's global batches: each step's micro-batches, lane by lane."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        flat = keys(iter(build(tokenizer)), STEPS * L)
    return [flat[s * L : (s + 1) * L] for s in range(STEPS)]


def test_a_rank_dealt_no_document_pads_on_under_repeat_as_its_lanes_do_in_one_process(
    tokenizer: Any,
) -> None:
    reference = one_process_steps(tokenizer)
    per_rank = L // W
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ranks = [
            list(islice(build(tokenizer, world_size=W, rank=r), STEPS * per_rank)) for r in range(W)
        ]
    starved = ranks[W - 1]
    assert len(starved) == STEPS * per_rank  # it ended at once: no batch at all
    assert all(batch.num_tokens == 0 for batch in starved)
    for step in range(STEPS):
        merged = [
            key(b) for r in range(W) for b in ranks[r][step * per_rank : (step + 1) * per_rank]
        ]
        assert merged == reference[step]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_starved_rank_s_loader_gives_padding_under_repeat(tokenizer: Any, workers: int) -> None:
    reference = one_process_steps(tokenizer)
    per_rank = L // W
    loader = DataLoader(build(tokenizer, world_size=W, rank=W - 1), num_workers=workers)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        items = list(islice(loader, STEPS * per_rank))
    assert len(items) == STEPS * per_rank
    expected = [k for step in reference for k in step[(W - 1) * per_rank :]]
    assert [item["input_ids"].numpy().tobytes() for item in items] == [k[2] for k in expected]
    assert all(int(item["num_valid_tokens"]) == 0 for item in items)
    # its state says the steps it delivered, as every other rank's does
    assert loader.state_dict()["step"] == STEPS
