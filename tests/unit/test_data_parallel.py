"""A data-parallel world inside a larger one (tensor, pipeline or context parallelism): the
`world_size`/`rank` options name it, checked against the processes' world; replicas of one
data-parallel rank must agree. (The collectives themselves: tests/integration/
test_spawned_ranks.py.)"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.helpers import small_pipeline
from zephon_torch import ConfigError, StateMismatchError
from zephon_torch.torch.distributed import _check_topologies, _merge_replicas, resolve_topology


@pytest.fixture
def four_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")


@pytest.mark.usefixtures("four_processes")
def test_a_world_dividing_the_processes_one_is_theirs_data_parallel_one(tokenizer: Any) -> None:
    assert resolve_topology(world_size=2, rank=1) == (2, 1)
    assert resolve_topology(world_size=1, rank=None) == (1, 0)
    assert resolve_topology(world_size=None, rank=None) == (4, 3)
    pipeline = small_pipeline(tokenizer).options(canonical_replicas=4)
    assert pipeline.options(world_size=2, rank=1).lanes == [2, 3]
    assert pipeline.options(world_size=1).lanes == [0, 1, 2, 3]


def test_a_world_from_the_environment_that_does_not_divide_the_lanes_says_so(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Named as the `world_size` option, which the user had not set (a fresh-user trial)."""
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "1")
    pipeline = small_pipeline(tokenizer).options(canonical_replicas=8)
    with pytest.raises(ConfigError, match=r"^the environment's WORLD_SIZE 3 does not divide"):
        pipeline.lanes  # noqa: B018
    with pytest.raises(ConfigError, match=r"^`world_size` 6 does not divide"):
        pipeline.options(world_size=6, rank=0).lanes  # noqa: B018


@pytest.mark.usefixtures("four_processes")
@pytest.mark.parametrize(
    ("world_size", "rank", "says"),
    [
        (3, 0, "must divide it"),
        (8, 0, "must divide it"),
        (2, None, "`rank` give this process's data-parallel rank"),
        (2, 2, "`rank` option is 2, not below `world_size` 2"),
        (4, 1, "`rank` option is 1, but the RANK/WORLD_SIZE environment says 3"),
    ],
)
def test_other_worlds_and_ranks_are_refused(world_size: int, rank: int | None, says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        resolve_topology(world_size=world_size, rank=rank)


def test_every_data_parallel_rank_must_be_held_by_a_process() -> None:
    _check_topologies([(2, 0), (2, 0), (2, 1), (2, 1)])
    with pytest.raises(ConfigError, match=r"no process holds data-parallel rank\(s\) \[1\] of 2"):
        _check_topologies([(2, 0), (2, 0), (2, 0), (2, 0)])
    with pytest.raises(ConfigError, match=r"rank\(s\) \[0, 1\] are not held by 2 processes each"):
        _check_topologies([(2, 0), (2, 0), (2, 0), (2, 1)])  # process 2 took process 0's rank
    with pytest.raises(ConfigError, match="different `world_size` options"):
        _check_topologies([(2, 0), (4, 1), (2, 1), (4, 3)])


def test_replicas_must_hold_one_state_per_lane() -> None:
    a, b = {"turn": 3}, {"turn": 5}
    parts = [{"0": a, "1": b}, {"0": a, "1": b}, {"2": b}, {"2": b}]
    assert _merge_replicas(parts) == {"0": a, "1": b, "2": b}
    with pytest.raises(StateMismatchError, match="process 0's state differs from process 1's"):
        _merge_replicas([{"0": a}, {"0": b}])


def test_processes_making_different_loader_calls_at_once_are_named() -> None:
    """One rank's iteration paired with another's state: a bare ValueError on one and a
    TypeError on the other, from unpacking each other's parts."""
    from zephon_torch.errors import ZephonError
    from zephon_torch.torch.distributed import _check_same_call

    _check_same_call([("iterating", (2, 0)), ("iterating", (2, 1))], "iterating")
    with pytest.raises(ZephonError, match="process 0: iterating, process 1: state_dict"):
        _check_same_call([("iterating", (2, 0)), ("state_dict", {}, (2, 1), {})], "iterating")


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"world_size": 2}, "`world_size` option is 2, but no `rank` is given"),
        ({"rank": 1}, "`rank` option is 1, but no `world_size` is given"),
    ],
)
def test_one_of_world_size_and_rank_without_a_process_group_or_environment_is_refused(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch, options: dict[str, int], says: str
) -> None:
    """Without a process group or RANK/WORLD_SIZE, `world_size=2` alone read as rank 0: every
    process of a job launched without RANK (mp.spawn, a SLURM script) read lanes 0-1, and
    lanes 2-3 went unread, without a word."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    pipeline = small_pipeline(tokenizer).options(canonical_replicas=4)
    with pytest.raises(ConfigError, match=re.escape(says)):
        pipeline.options(**options).lanes  # noqa: B018
    assert pipeline.options(world_size=2, rank=1).lanes == [2, 3]
    assert pipeline.options(world_size=1).lanes == [0, 1, 2, 3]
    assert pipeline.options(rank=0).lanes == [0, 1, 2, 3]
    with pytest.raises(ConfigError, match=r"`rank` option is 4 without `world_size`"):
        pipeline.options(rank=4)  # past any world of 4 lanes: refused at once


@pytest.mark.usefixtures("four_processes")
def test_a_loader_s_state_without_a_process_group_to_gather_over_says_it_is_one_rank_s(
    tokenizer: Any,
) -> None:
    """Ranks told by torchrun's environment alone: the loader ran its rank's lanes, and its
    state_dict() held them only, without a word; saved from rank 0, as checkpoints are, the
    run could not resume (a fresh-user trial)."""
    import warnings

    from zephon_torch import ZephonWarning, merge_states
    from zephon_torch.torch import DataLoader

    pipeline = small_pipeline(tokenizer).options(canonical_replicas=8)
    loader = DataLoader(pipeline)
    iterator = iter(loader)
    next(iterator)
    with warnings.catch_warnings(record=True) as heard:
        warnings.simplefilter("always")
        states = [loader.state_dict(), loader.state_dict()]  # warned once a loader
    said = [w for w in heard if w.category is ZephonWarning]
    assert [str(w.message) for w in said] == [
        "state_dict() holds rank 3's lanes only (2 of 8): the world size is 4 but no "
        "torch.distributed process group is initialised to gather the other ranks' over. "
        "Initialise one (torch.distributed.init_process_group) before iterating, or save "
        "every rank's state and merge them with zephon_torch.merge_states"
    ]
    assert sorted(states[0]["lanes"]) == ["6", "7"]
    single = DataLoader(small_pipeline(tokenizer).options(canonical_replicas=8, world_size=1))
    with pytest.raises(StateMismatchError, match=r"where a torch\.distributed process group is"):
        single.load_state_dict(states[0])
    with pytest.raises(StateMismatchError, match=r"needs \[0, 1, 2, 3, 4, 5\]"):
        single.load_state_dict(merge_states([states[0]]))  # one rank's cannot be made whole
    next(iter(single))
    with warnings.catch_warnings():
        warnings.simplefilter("error", ZephonWarning)
        assert len(single.state_dict()["lanes"]) == 8  # one rank: all lanes, no warning
