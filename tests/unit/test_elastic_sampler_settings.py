"""ElasticDistributedSampler as a DistributedSampler drop-in: its type, and its settings as plain
ints (a JSON state) or a ConfigError naming them."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from torch.utils.data import Dataset, DistributedSampler

from zephon_torch.elastic import ElasticDistributedSampler
from zephon_torch.errors import ConfigError


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


def _epoch(epoch: int) -> list[int]:
    s = sampler()
    s.set_epoch(epoch)
    return list(s)
