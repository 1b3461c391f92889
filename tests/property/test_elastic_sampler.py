"""ElasticDistributedSampler: the per-step union over W ranks is the same global batch for W | G."""

from __future__ import annotations

import json
from collections import Counter
from itertools import islice
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_torch.elastic import ElasticDistributedSampler, supported_world_sizes
from zephon_torch.errors import ConfigError, StateMismatchError


class Sized:
    """Only the length of the dataset matters to the sampler."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n


def sampler(n: int, g: int, w: int, r: int, **kw: Any) -> ElasticDistributedSampler:
    return ElasticDistributedSampler(Sized(n), num_replicas=w, rank=r, global_batch_size=g, **kw)


def global_steps(
    n: int, g: int, w: int, *, epoch: int = 0, state: dict[str, Any] | None = None, **kw: Any
) -> list[list[int]]:
    """Per step, the ranks' shares concatenated in rank order."""
    per_rank = []
    for r in range(w):
        s = sampler(n, g, w, r, **kw)
        s.set_epoch(epoch if state is None else state["epoch"])  # a loop names the state's epoch
        if state is not None:
            s.load_state_dict(state)
        share = g // w
        assert len(s) == s.num_global_batches() * share  # a whole epoch, as DistributedSampler
        expected = (s.num_global_batches() - (state or {}).get("global_batches", 0)) * share
        indices = list(s)
        assert len(indices) == expected
        per_rank.append([indices[i : i + share] for i in range(0, len(indices), share)])
    return [[i for share in shares for i in share] for shares in zip(*per_rank)]


def flat(steps: list[list[int]]) -> list[int]:
    return [i for step in steps for i in step]


sizes = st.integers(1, 500)
batches = st.integers(1, 48)
seeds = st.integers(0, 2**40)
epochs = st.integers(0, 1000)
flags = st.tuples(st.booleans(), st.booleans())  # shuffle, drop_last


def world_sizes(g: int) -> st.SearchStrategy[int]:
    return st.sampled_from(supported_world_sizes(canonical_replicas=g))


@settings(deadline=None)
@given(n=sizes, g=batches, seed=seeds, epoch=epochs, shuffle=st.booleans(), data=st.data())
def test_without_drop_last_every_index_appears_and_only_the_wrapped_padding_repeats(
    n: int, g: int, seed: int, epoch: int, shuffle: bool, data: st.DataObject
) -> None:
    w = data.draw(world_sizes(g))
    stream = flat(global_steps(n, g, w, epoch=epoch, seed=seed, shuffle=shuffle))
    padding = -(-n // g) * g - n
    assert len(stream) == n + padding
    assert sorted(stream[:n]) == list(range(n))
    assert stream[n:] == [stream[p % n] for p in range(n, n + padding)]
    assert Counter(stream) == Counter(range(n)) + Counter(stream[n:])


@settings(deadline=None)
@given(n=sizes, g=batches, seed=seeds, epoch=epochs, shuffle=st.booleans(), data=st.data())
def test_with_drop_last_no_index_repeats_and_only_the_tail_is_dropped(
    n: int, g: int, seed: int, epoch: int, shuffle: bool, data: st.DataObject
) -> None:
    w = data.draw(world_sizes(g))
    stream = flat(global_steps(n, g, w, epoch=epoch, seed=seed, shuffle=shuffle, drop_last=True))
    assert len(stream) == len(set(stream)) == n // g * g
    assert set(stream) <= set(range(n))


@settings(deadline=None)
@given(n=sizes, g=batches, seed=seeds, epoch=epochs, shuffle=st.booleans(), drop_last=st.booleans())
def test_each_step_is_the_same_global_batch_for_every_world_size(
    n: int, g: int, seed: int, epoch: int, shuffle: bool, drop_last: bool
) -> None:
    kw = {"seed": seed, "shuffle": shuffle, "drop_last": drop_last, "epoch": epoch}
    reference = global_steps(n, g, 1, **kw)
    assert all(len(step) == g for step in reference)
    for w in supported_world_sizes(canonical_replicas=g)[1:]:
        assert global_steps(n, g, w, **kw) == reference


@settings(deadline=None)
@given(n=sizes, g=batches, seed=seeds, epoch=epochs, flags=flags, data=st.data())
def test_resume_on_another_world_size_continues_the_uninterrupted_stream(
    n: int, g: int, seed: int, epoch: int, flags: tuple[bool, bool], data: st.DataObject
) -> None:
    kw = {"seed": seed, "shuffle": flags[0], "drop_last": flags[1]}
    reference = global_steps(n, g, 1, epoch=epoch, **kw)
    k = data.draw(st.integers(0, len(reference)), label="consumed global batches")
    w1 = data.draw(world_sizes(g), label="world size before")
    w2 = data.draw(world_sizes(g), label="world size after")
    states = []
    for r in range(w1):
        s = sampler(n, g, w1, r, **kw)
        s.set_epoch(epoch)
        share = g // w1
        # Stop part-way into the next share: a state between micro-batches rounds down.
        extra = data.draw(st.integers(0, share - 1 if k < len(reference) else 0), label="extra")
        consumed = list(islice(iter(s), k * share + extra))
        assert consumed[: k * share] == flat(
            [step[r * share : (r + 1) * share] for step in reference[:k]]
        )
        assert s.state_dict() == s.state_dict(consumed_global_batches=k)
        states.append(s.state_dict(consumed_global_batches=k))
    assert all(state == states[0] for state in states)
    state = json.loads(json.dumps(states[0]))
    assert state == states[0]
    assert global_steps(n, g, w2, state=state, **kw) == reference[k:]


@settings(deadline=None)
@given(
    n=st.integers(10, 500), g=batches, seed=seeds, epochs=st.sets(epochs, min_size=2, max_size=2)
)
def test_epochs_shuffle_differently_and_an_epoch_always_repeats_its_order(
    n: int, g: int, seed: int, epochs: set[int]
) -> None:
    first, second = (flat(global_steps(n, g, 1, epoch=e, seed=seed)) for e in sorted(epochs))
    assert first != second
    assert first == flat(global_steps(n, g, 1, epoch=min(epochs), seed=seed))


@settings(deadline=None)
@given(n=sizes, g=batches)
def test_without_shuffle_the_order_is_natural_and_padding_wraps_to_the_start(
    n: int, g: int
) -> None:
    stream = flat(global_steps(n, g, 1, shuffle=False))
    assert stream == [p % n for p in range(len(stream))]


@settings(deadline=None)
@given(g=batches, w=st.integers(1, 60))
def test_a_world_size_that_does_not_divide_the_global_batch_is_refused_with_the_supported_sizes(
    g: int, w: int
) -> None:
    if g % w == 0:
        assert sampler(10, g, w, w - 1).rank_batch_size == g // w
        return
    with pytest.raises(ConfigError) as err:
        sampler(10, g, w, 0)
    assert f"supported world sizes: {supported_world_sizes(canonical_replicas=g)}" in str(err.value)
    assert "`num_replicas`" in str(err.value)


changed_settings = {
    "seed": 1,
    "global_batch_size": 6,
    "shuffle": False,
    "drop_last": True,
    "dataset_len": 31,
    "version": 2,
}


@settings(deadline=None)
@given(keys=st.sets(st.sampled_from(sorted(changed_settings)), min_size=1))
def test_a_state_with_other_settings_is_refused_with_every_mismatch(keys: set[str]) -> None:
    state = sampler(30, 4, 2, 1).state_dict()
    bad = state | {key: changed_settings[key] for key in keys}
    target = sampler(30, 4, 4, 3)
    with pytest.raises(StateMismatchError) as err:
        target.load_state_dict(bad)
    assert set(err.value.mismatches) == keys
    for key in keys:
        assert err.value.mismatches[key] == (changed_settings[key], state[key])
    assert target.state_dict() == state


def test_a_state_outside_the_epoch_is_refused_and_so_is_a_step_count_past_it() -> None:
    s = sampler(30, 4, 2, 0)  # 8 global batches per epoch
    with pytest.raises(StateMismatchError) as err:
        s.load_state_dict(s.state_dict() | {"global_batches": 9, "epoch": -1})
    assert set(err.value.mismatches) == {"global_batches", "epoch"}
    with pytest.raises(StateMismatchError, match="global_batches"):
        s.load_state_dict(s.state_dict() | {"global_batches": -1})
    with pytest.raises(ConfigError, match=r"`consumed_global_batches` must be in \[0, 8\]"):
        s.state_dict(consumed_global_batches=9)
    with pytest.raises(ConfigError, match=r"must be in \[0, 8\] \(the global .* got -1"):
        s.state_dict(consumed_global_batches=-1)
    assert s.state_dict(consumed_global_batches=8)["global_batches"] == 8


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"WORLD_SIZE": "two"},
            "environment variable WORLD_SIZE must be an integer >= 0, got 'two'",
        ),
        ({"WORLD_SIZE": "4", "RANK": "-1"}, "environment variable RANK must be an integer >= 0"),
        ({"WORLD_SIZE": "4", "RANK": "4"}, r"environment variable RANK must be in \[0, 4\), got 4"),
        ({"WORLD_SIZE": "0"}, "environment variable WORLD_SIZE must be positive, got 0"),
        ({"WORLD_SIZE": "5", "RANK": "0"}, "environment variable WORLD_SIZE 5 does not divide"),
        ({"WORLD_SIZE": "2"}, "environment variable WORLD_SIZE is 2, but nothing says this"),
    ],
)
def test_malformed_environment_values_are_refused_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    monkeypatch.delenv("RANK", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=message):
        ElasticDistributedSampler(Sized(10), global_batch_size=8)


def test_the_topology_comes_from_the_environment_unless_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    s = ElasticDistributedSampler(Sized(10), global_batch_size=8)
    assert (s.num_replicas, s.rank, s.rank_batch_size) == (4, 3, 2)
    s = ElasticDistributedSampler(Sized(10), num_replicas=2, rank=1, global_batch_size=8)
    assert (s.num_replicas, s.rank) == (2, 1)
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("RANK")
    s = ElasticDistributedSampler(Sized(10), global_batch_size=8)
    assert (s.num_replicas, s.rank) == (1, 0)


def test_a_world_of_several_with_no_rank_from_anywhere_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`num_replicas=2` with no `rank`, no process group and no RANK took rank 0: each
    process of an `mp.spawn` job (or a Lightning DDP one that made its sampler before the
    process group) drew rank 0's indices, the data twice over. The pipeline refuses the same
    half-set topology."""
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ConfigError, match=r"`num_replicas` is 2, but nothing says this process"):
        ElasticDistributedSampler(Sized(10), num_replicas=2, global_batch_size=8)
    assert ElasticDistributedSampler(Sized(10), num_replicas=1, global_batch_size=8).rank == 0


def test_set_epoch_keeps_a_loaded_resume_point_for_its_epoch_and_the_next_pass_starts_over() -> (
    None
):
    full = global_steps(50, 4, 2, epoch=3)
    s = sampler(50, 4, 2, 0)
    s.load_state_dict(s.state_dict() | {"epoch": 3, "global_batches": 5})
    s.set_epoch(3)
    assert len(s) == len(full) * 2  # a whole epoch; the pass yields the rest
    assert len(list(sampler(50, 4, 2, 0))) == len(s)
    assert list(s) == flat([step[:2] for step in full[5:]])
    assert s.state_dict()["global_batches"] == len(full)
    assert list(s) == flat([step[:2] for step in full])
    s.load_state_dict(s.state_dict() | {"epoch": 3, "global_batches": 5})
    s.set_epoch(4)
    assert list(s) == flat([step[:2] for step in global_steps(50, 4, 2, epoch=4)])


def test_a_state_at_an_epochs_end_resumes_on_the_side_the_loop_names_and_else_goes_on() -> None:
    """The end of epoch 2 is the start of epoch 3. A loop that names epoch 2 (set_epoch, before
    or after the load) gets its empty rest; one that names none yet, Lightning's order, gets
    epoch 3, however far its iterator drew before Lightning's set_epoch(3)."""
    s = sampler(50, 4, 2, 1)
    s.set_epoch(2)
    list(s)
    finished = s.state_dict()
    assert finished["epoch"] == 2
    assert finished["global_batches"] == s.num_global_batches()
    epoch_3 = flat([step[2:] for step in global_steps(50, 4, 2, epoch=3)])
    for named_first in (True, False):
        named = sampler(50, 4, 2, 1)
        if named_first:
            named.set_epoch(2)
        named.load_state_dict(finished)
        named.set_epoch(2)
        assert list(named) == [] and list(named) == []  # finished until set_epoch moves on
        named.set_epoch(3)
        assert list(named) == epoch_3
    for drawn in (0, 1, len(epoch_3)):  # what a DataLoader's workers drew before set_epoch
        unnamed = sampler(50, 4, 2, 1)
        unnamed.load_state_dict(finished)
        passing = iter(unnamed)
        head = list(islice(passing, drawn))
        unnamed.set_epoch(3)
        assert head + list(passing) == epoch_3
        assert unnamed.state_dict()["epoch"] == 3
    later = sampler(50, 4, 2, 1)
    later.set_epoch(3)
    later.load_state_dict(finished)
    assert list(later) == epoch_3


def test_a_pass_that_ran_to_its_end_starts_its_epoch_over_as_distributed_samplers_do() -> None:
    s = sampler(50, 4, 2, 1)
    s.set_epoch(2)
    assert list(s) == list(s) == flat([step[2:] for step in global_steps(50, 4, 2, epoch=2)])
