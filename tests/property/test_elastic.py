"""Elastic determinism: the per-step union of W ranks' batches is the W=1 stream, for W | L."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers import key, keys, small_pipeline, two_sources
from zephon_torch import Batch, merge_states
from zephon_torch.elastic import supported_world_sizes

DATASETS = two_sources(50, 40, shard_size=9)


def global_steps(tokenizer: Any, lanes: int, world_size: int, **kw: Any) -> dict[int, list[Any]]:
    """turn -> the batches of that turn from every rank, in rank (so lane) order."""
    steps: dict[int, list[Any]] = {}
    for rank in range(world_size):
        pipeline = small_pipeline(
            tokenizer, lanes=lanes, world_size=world_size, rank=rank, datasets=DATASETS, **kw
        )
        for batch in pipeline:
            steps.setdefault(batch.turn, []).append(batch)
    return steps


def padded(steps: dict[int, list[Batch]], lanes: int) -> list[list[tuple[Any, ...]]]:
    """Per turn, one entry per lane; a rank that already ended contributes padding."""
    out = []
    for turn in sorted(steps):
        by_lane = {b.lane: b for b in steps[turn]}
        row = []
        for lane in range(lanes):
            b = by_lane.get(lane)
            row.append(("padding", lane) if b is None or b.num_tokens == 0 else key(b))
        out.append(row)
    return out


@pytest.mark.parametrize("lanes", [1, 4, 12])
def test_every_world_size_dividing_l_gives_the_single_rank_global_stream(
    tokenizer: Any, lanes: int
) -> None:
    reference = padded(global_steps(tokenizer, lanes, 1), lanes)
    assert any(k[0] != "padding" for row in reference for k in row)
    for world_size in supported_world_sizes(canonical_replicas=lanes)[1:]:
        assert padded(global_steps(tokenizer, lanes, world_size), lanes) == reference, world_size


@given(
    algorithm=st.sampled_from(["wrap", "best_fit"]),
    microbatch=st.integers(1, 3),
    max_length=st.sampled_from([16, 40, 96]),
)
@settings(
    max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_elastic_equality_holds_for_any_packing_shape(
    tokenizer: Any, algorithm: str, microbatch: int, max_length: int
) -> None:
    kw = {"algorithm": algorithm, "microbatch_size": microbatch, "max_length": max_length}
    reference = padded(global_steps(tokenizer, 4, 1, **kw), 4)
    for world_size in (2, 4):
        assert padded(global_steps(tokenizer, 4, world_size, **kw), 4) == reference


@pytest.mark.parametrize("target_world_size", [2, 1])
def test_a_state_saved_on_four_ranks_resumes_on_fewer_with_the_same_global_stream(
    tokenizer: Any, target_world_size: int
) -> None:
    lanes, cut = 4, 5
    reference = padded(global_steps(tokenizer, lanes, 1), lanes)
    states = []
    for rank in range(4):
        pipeline = small_pipeline(
            tokenizer, lanes=lanes, world_size=4, rank=rank, datasets=DATASETS
        )
        for turn, _ in enumerate(pipeline):
            if turn + 1 == cut:
                break
        states.append(pipeline.state_dict())
    merged = merge_states(states)
    assert merged["step"] == cut
    resumed: dict[int, list[Batch]] = {}
    for rank in range(target_world_size):
        pipeline = small_pipeline(
            tokenizer, lanes=lanes, world_size=target_world_size, rank=rank, datasets=DATASETS
        )
        pipeline.load_state_dict(merged)
        for batch in pipeline:
            resumed.setdefault(batch.turn, []).append(batch)
    assert min(resumed) == cut
    assert padded(resumed, lanes) == reference[cut:]


def test_global_batches_are_not_trivially_equal_across_lanes(tokenizer: Any) -> None:
    steps = global_steps(tokenizer, 4, 1)
    first = steps[0]
    assert len({b.input_ids.tobytes() for b in first}) == 4
    assert all(np.all(b.input_ids >= 0) for b in first)
    assert len(keys(first)) == 4
