"""ElasticDistributedSampler as a DistributedSampler drop-in: its type, and its settings as plain
ints (a JSON state) or a ConfigError naming them."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from torch.utils.data import Dataset, DistributedSampler

from zephon_torch.elastic import ElasticDistributedSampler, num_global_batches, rank_indices
from zephon_torch.errors import ConfigError, StateMismatchError


class IndexDataset(Dataset[int]):
    """Map-style dataset whose sample is its own index; module-level so spawn can pickle it."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> int:
        return index


def sampler(**kw: Any) -> ElasticDistributedSampler:
    kw = {"num_replicas": 2, "rank": 1, "global_batch_size": 8} | kw
    return ElasticDistributedSampler(IndexDataset(), **kw)


def test_frameworks_recognise_it_as_a_distributed_sampler() -> None:
    # Lightning (Trainer and Fabric, use_distributed_sampler=True by default) and other
    # frameworks test isinstance(sampler, DistributedSampler); any other sampler is wrapped
    # in a second DistributedSampler that splits the rank's share again.
    s = sampler(seed=3)
    assert isinstance(s, DistributedSampler)
    settings = (s.num_replicas, s.rank, s.epoch, s.seed, s.shuffle, s.drop_last)
    assert settings == (2, 1, 0, 3, True, False)
    assert (s.num_samples, s.total_size) == (len(s), 32)


@pytest.mark.parametrize("size", [np.int64(8), np.int32(8)])
def test_a_numpy_global_batch_size_gives_a_json_state(size: Any) -> None:
    s = sampler(global_batch_size=size)
    state = s.state_dict()
    assert json.loads(json.dumps(state)) == sampler().state_dict()


def test_a_numpy_step_count_gives_a_json_state_that_loads() -> None:
    state = sampler().state_dict(consumed_global_batches=np.int64(2))
    assert json.loads(json.dumps(state))["global_batches"] == 2
    resumed = sampler(num_replicas=4, rank=0)
    resumed.load_state_dict(state)  # a torch.save checkpoint keeps the numpy int as it is
    assert len(list(resumed)) == 2 * 2


@pytest.mark.parametrize(
    ("kw", "name"),
    [
        ({"global_batch_size": 8.0}, "`global_batch_size`"),
        ({"global_batch_size": "8"}, "`global_batch_size`"),
        ({"num_replicas": 2.0}, "`num_replicas`"),
        ({"rank": 1.0}, "`rank`"),
        ({"seed": 1.5}, "`seed`"),
    ],
)
def test_a_non_integer_setting_is_refused_naming_it(kw: dict[str, Any], name: str) -> None:
    with pytest.raises(ConfigError, match=name):
        sampler(**kw)


def test_set_epoch_refuses_an_epoch_whose_state_could_not_be_loaded() -> None:
    s = sampler()
    with pytest.raises(ConfigError, match="`epoch`"):
        s.set_epoch(-1)
    assert s.epoch == 0


def test_a_pass_started_before_a_load_or_a_later_pass_is_stale() -> None:
    """An older pass went on with its own stream and counted its position over the loaded one:
    the next state_dict() then named a step the loop never reached."""
    reference = list(sampler())
    s = sampler()
    old = iter(s)
    got = [next(old) for _ in range(4)]  # one share of 4 indices: global batch 0
    saved = s.state_dict()
    got += [next(old) for _ in range(4)]
    s.load_state_dict(saved)
    with pytest.raises(RuntimeError, match="stale"):
        next(old)
    assert s.state_dict() == saved
    newer = iter(s)
    got += [next(newer) for _ in range(4)]
    assert got == reference[:8] + reference[4:8]
    latest = iter(s)
    next(latest)
    with pytest.raises(RuntimeError, match="stale"):
        next(newer)
    s.set_epoch(1)
    with pytest.raises(RuntimeError, match="stale"):
        next(latest)
    assert list(s) == _epoch(1)


def test_a_pass_begun_before_a_load_and_a_change_of_epoch_is_stale() -> None:
    """Every move of the position makes older passes stale, however many moves there were."""
    s = sampler()
    old = iter(s)
    next(old)
    s.load_state_dict(s.state_dict(consumed_global_batches=2))
    s.set_epoch(5)
    with pytest.raises(RuntimeError, match="stale"):
        next(old)
    assert list(s) == _epoch(5)


def test_a_new_pass_that_has_not_drawn_is_the_state_at_once() -> None:
    """A StatefulDataLoader snapshots the sampler as it makes an iterator: the new pass's
    start, not what a discarded pass had drawn."""
    s = sampler()
    discarded = iter(s)
    for _ in range(8):  # two shares: global batches 0 and 1
        next(discarded)
    assert s.state_dict()["global_batches"] == 2
    fresh = iter(s)
    assert s.state_dict()["global_batches"] == 0
    assert list(fresh) == _epoch(0)


def test_a_stale_pass_leaves_the_position_of_the_newest_alone() -> None:
    """A stale pass raises at its first index as at any other, before it touches the sampler:
    the newest pass's count of consumed global batches stays."""
    s = sampler()
    old, newest = iter(s), iter(s)
    drawn = [next(newest) for _ in range(4)]  # global batch 0, rank 1's share
    with pytest.raises(RuntimeError, match="stale"):
        next(old)
    assert s.state_dict()["global_batches"] == 1
    assert drawn + list(newest) == _epoch(0)


def test_a_pass_whose_indices_were_all_drawn_before_set_epoch_is_stale_at_its_end() -> None:
    """A DataLoader's workers may draw a whole epoch before the loop's set_epoch; the pass
    then ends with the stale error, not quietly as if the new epoch were empty."""
    s = sampler()
    passing = iter(s)
    assert [next(passing) for _ in range(len(s))] == _epoch(0)
    s.set_epoch(1)
    with pytest.raises(RuntimeError, match="stale"):
        next(passing)
    assert list(s) == _epoch(1)


def test_an_epoch_with_no_global_batch_keeps_its_number() -> None:
    """With ``drop_last`` and fewer samples than one global batch an epoch is empty; passing
    over it leaves the sampler at that epoch (only a loaded end of an epoch moves on)."""
    s = ElasticDistributedSampler([0] * 3, 2, 1, drop_last=True, global_batch_size=8)
    assert list(s) == [] and list(s) == []
    assert (s.state_dict()["epoch"], s.state_dict()["global_batches"]) == (0, 0)


def test_the_end_of_a_one_batch_epoch_loaded_goes_on_to_the_next_epoch() -> None:
    s = sampler(num_replicas=1, rank=0, global_batch_size=32)  # one global batch an epoch
    list(s)
    resumed = sampler(num_replicas=1, rank=0, global_batch_size=32)
    resumed.load_state_dict(s.state_dict())
    assert list(resumed) == _epoch_of(1, num_replicas=1, rank=0, global_batch_size=32)
    assert resumed.state_dict()["epoch"] == 1


def test_a_share_larger_than_the_sampler_s_chunk_is_drawn_whole() -> None:
    """A rank draws its indices some global batches at a time (``_CHUNK_SAMPLES`` indices);
    a share of more than that is still one global batch a chunk."""
    size = (1 << 16) + 8
    s = ElasticDistributedSampler([0] * 5, 1, 0, global_batch_size=size)
    drawn = list(s)
    assert len(drawn) == size and sorted(set(drawn)) == list(range(5))


def test_an_epochs_end_loaded_after_another_epoch_was_named() -> None:
    """Named later (the loop's ``set_epoch(e + 1)`` came first, as StatefulDataLoader loads at
    the next ``iter``): the sampler stays where it is, at the start of that epoch, and a pass
    already begun goes on. Named earlier (a loop's ``set_epoch(0)`` before the load): that name
    is not the state's epoch, which goes on to the next."""
    finished = sampler()
    finished.set_epoch(2)
    list(finished)
    later = sampler()
    later.set_epoch(3)
    passing = iter(later)
    head = [next(passing)]
    later.load_state_dict(finished.state_dict())
    assert (later.state_dict()["epoch"], later.state_dict()["global_batches"]) == (3, 0)
    assert head + list(passing) == _epoch(3)
    earlier = sampler()
    earlier.set_epoch(0)
    earlier.load_state_dict(finished.state_dict())
    assert list(earlier) == _epoch(3)


def _epoch(epoch: int) -> list[int]:
    return _epoch_of(epoch)


def _epoch_of(epoch: int, **kw: Any) -> list[int]:
    s = sampler(**kw)
    s.set_epoch(epoch)
    return list(s)


@pytest.mark.parametrize("name", ["shuffle", "drop_last"])
@pytest.mark.parametrize("value", ["False", "no", 0, 1, None])
def test_a_flag_that_is_not_a_bool_is_refused_naming_it(name: str, value: Any) -> None:
    """``shuffle="False"`` shuffled and ``drop_last="no"`` dropped the tail."""
    with pytest.raises(ConfigError, match=f"`{name}` must be True or False, got {value!r}"):
        sampler(**{name: value})


@pytest.mark.parametrize("name", ["shuffle", "drop_last"])
def test_a_numpy_bool_flag_gives_a_json_state(name: str) -> None:
    s = sampler(**{name: np.bool_(True)})
    assert json.loads(json.dumps(s.state_dict())) == sampler(**{name: True}).state_dict()


@pytest.mark.parametrize("key", ["epoch", "global_batches"])
def test_a_state_whose_position_is_a_bool_is_refused(key: str) -> None:
    s = sampler()
    with pytest.raises(StateMismatchError) as err:
        s.load_state_dict(s.state_dict() | {key: True})
    assert set(err.value.mismatches) == {key}
    assert s.state_dict()["epoch"] == 0


def test_a_state_with_numpy_positions_loads_as_plain_ints() -> None:
    s = sampler()
    s.load_state_dict(s.state_dict() | {"epoch": np.int64(3), "global_batches": np.int32(1)})
    state = s.state_dict()
    assert (type(state["epoch"]), type(state["global_batches"])) == (int, int)
    assert (state["epoch"], state["global_batches"]) == (3, 1)


HELPER = {
    "dataset_len": 10,
    "global_batch_size": 2,
    "world_size": 1,
    "rank": 0,
    "seed": 1,
    "epoch": 0,
    "shuffle": True,
    "drop_last": False,
}


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"seed": 1.7}, "`seed` must be an integer, got 1.7"),
        ({"epoch": 0.9}, "`epoch` must be an integer, got 0.9"),
        ({"epoch": -3}, "`epoch` must be >= 0, got -3"),
        ({"dataset_len": -5}, "`dataset_len` must be >= 0, got -5"),
        ({"global_batch_size": 0}, "`global_batch_size` must be positive, got 0"),
        ({"shuffle": "False"}, "`shuffle` must be True or False"),
        ({"start_batch": 1.0}, "`start_batch` must be an integer"),
        ({"world_size": 3}, "`world_size` 3 does not divide `global_batch_size` 2"),
        ({"rank": 1}, r"`rank` must be in \[0, 1\), got 1"),
        ({"start_batch": -1}, r"need 0 <= `start_batch` <= `stop_batch` <= 5, got -1, 5"),
        ({"start_batch": 3, "stop_batch": 2}, "got 3, 2"),
        ({"stop_batch": 6}, "got 0, 6"),
    ],
)
def test_rank_indices_checks_its_arguments_as_the_sampler_does(
    kw: dict[str, Any], message: str
) -> None:
    """A float seed or epoch was truncated to another permutation's, a negative epoch taken."""
    with pytest.raises(ConfigError, match=message):
        rank_indices(**(HELPER | kw))


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"global_batch_size": 0}, "`global_batch_size` must be positive, got 0"),
        ({"dataset_len": -5}, "`dataset_len` must be >= 0, got -5"),
        ({"drop_last": "yes"}, "`drop_last` must be True or False"),
        ({"global_batch_size": 2.0}, "`global_batch_size` must be an integer"),
    ],
)
def test_num_global_batches_checks_its_arguments(kw: dict[str, Any], message: str) -> None:
    """``global_batch_size=0`` was a bare ZeroDivisionError."""
    args = {"dataset_len": 10, "global_batch_size": 4, "drop_last": False} | kw
    with pytest.raises(ConfigError, match=message):
        num_global_batches(**args)


def test_the_helpers_take_numpy_integers_as_the_sampler_does() -> None:
    kw = HELPER | {"seed": np.int64(1), "epoch": np.int32(0), "dataset_len": np.int64(10)}
    assert rank_indices(**kw) == rank_indices(**HELPER)
    assert num_global_batches(dataset_len=np.int64(10), global_batch_size=4, drop_last=True) == 2


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize(("n", "world"), [(1, 2), (7, 1), (10, 4), (3, 2)])
def test_rank_indices_with_no_batch_range_is_the_samplers_whole_epoch(
    n: int, world: int, shuffle: bool
) -> None:
    """Without ``start_batch`` and ``stop_batch`` a rank's whole epoch, as its sampler yields it;
    a range inside the epoch is its slice, an empty one nothing. A dataset of one sample pads
    with that sample."""
    kw = {"dataset_len": n, "global_batch_size": 4, "seed": 5, "epoch": 2, "shuffle": shuffle}
    for rank in range(world):
        s = ElasticDistributedSampler([0] * n, world, rank, shuffle, 5, global_batch_size=4)
        s.set_epoch(2)
        whole = rank_indices(world_size=world, rank=rank, drop_last=False, **kw)
        assert whole == list(s)
        assert len(whole) == -(-n // 4) * (4 // world) and set(whole) <= set(range(n))
        total = num_global_batches(dataset_len=n, global_batch_size=4, drop_last=False)
        share = 4 // world
        if total > 1:
            part = rank_indices(
                world_size=world, rank=rank, drop_last=False, start_batch=1, stop_batch=2, **kw
            )
            assert part == whole[share : 2 * share]
        for at in (0, total):
            empty = rank_indices(
                world_size=world, rank=rank, drop_last=False, start_batch=at, stop_batch=at, **kw
            )
            assert empty == []
