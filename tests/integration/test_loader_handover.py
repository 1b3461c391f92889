"""A loader iterates its own copy of the pipeline it was made from: the pipeline's own state
stays where the loader started, and a state loaded into the pipeline afterwards does not reach
the loader. Both repeated data after a resume without a word; now each is a ConfigError saying
which state to save or load (``zephon_torch.torch._handover``)."""

from __future__ import annotations

import functools
import json
import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import small_pipeline
from zephon_torch import ConfigError
from zephon_torch.torch import DataLoader

pytestmark = pytest.mark.filterwarnings("ignore:this state was saved mid-step")


def _build(tokenizer: Any) -> Any:
    return small_pipeline(tokenizer, lanes=2, exhaustion="repeat")


def _ids(items: Any, count: int) -> list[list[list[int]]]:
    return [item["input_ids"].tolist() for _, item in zip(range(count), items)]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_pipeline_a_loader_delivered_from_refuses_its_stale_state(
    tokenizer: Any, num_workers: int
) -> None:
    pipeline = _build(tokenizer)
    at_start = pipeline.state_dict()  # nothing delivered yet: its state is the loop's
    loader = DataLoader(pipeline, num_workers=num_workers, multiprocessing_context="fork")
    items = iter(loader)
    _ids(items, 4)
    with pytest.raises(ConfigError, match=r"save `loader\.state_dict\(\)`") as raised:
        pipeline.state_dict()
    assert "would repeat data" in str(raised.value)
    saved = loader.state_dict()  # the loop's: 4 micro-batches of 2 lanes
    assert saved["step"] == 2 and at_start["step"] == 0
    assert pipeline.stats()["batches"] == 0  # stats describe the pipeline's own iteration
    # resuming from the loader's state gives what the loader gives next
    expected = _ids(items, 4)
    resumed = _build(tokenizer)
    resumed.load_state_dict(json.loads(json.dumps(saved)))
    assert _ids(DataLoader(resumed), 4) == expected
    # the pipeline iterated itself: its own state is current again
    next(iter(pipeline))
    assert pipeline.state_dict()["step"] == 0  # one micro-batch of two lanes: mid-step 0


def test_a_torch_loader_of_to_torch_marks_its_pipeline_too(tokenizer: Any) -> None:
    pipeline = _build(tokenizer)
    loader = torch.utils.data.DataLoader(pipeline.to_torch(), batch_size=None)
    _ids(iter(loader), 2)
    with pytest.raises(ConfigError, match=r"made from it by `to_torch\(\)`.*StatefulDataLoader"):
        pipeline.state_dict()
    pipeline.load_state_dict(_build(tokenizer).state_dict())  # loaded: current again
    assert pipeline.state_dict()["step"] == 0


def test_a_state_loaded_into_the_pipeline_after_its_loader_was_made_is_refused(
    tokenizer: Any,
) -> None:
    first = DataLoader(_build(tokenizer))
    items = iter(first)
    _ids(items, 6)
    saved = json.loads(json.dumps(first.state_dict()))
    expected = _ids(items, 4)

    pipeline = _build(tokenizer)
    loader = DataLoader(pipeline)
    pipeline.load_state_dict(saved)  # too late: the loader copied the pipeline before
    with pytest.raises(ConfigError, match=r"`loader\.load_state_dict\(state\)`"):
        next(iter(loader))
    loader.load_state_dict(saved)  # the loader's own load: it starts there
    assert _ids(loader, 4) == expected
    # in that order (load, then make the loader) nothing is refused
    pipeline = _build(tokenizer)
    pipeline.load_state_dict(saved)
    assert _ids(DataLoader(pipeline), 4) == expected


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_to_torch_dataset_refuses_a_pass_after_its_pipeline_loaded_a_state(
    tokenizer: Any, num_workers: int
) -> None:
    """Also inside a torch loader's forked workers, and in a pickled (spawned) copy, which
    cannot follow the pipeline: what the pickling process found travels with it."""
    saved = _build(tokenizer).state_dict()
    pipeline = _build(tokenizer)
    dataset = pipeline.to_torch()
    pipeline.load_state_dict(saved)
    context = "fork" if num_workers else None
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=None, num_workers=num_workers, multiprocessing_context=context
    )
    with pytest.raises(ConfigError, match="loaded a state after it was made"):
        next(iter(loader))
    with pytest.raises(ConfigError, match="loaded a state after it was made"):
        iter(pickle.loads(pickle.dumps(dataset)))
    dataset.load_state_dict(saved)  # its own load
    assert len(_ids(iter(dataset), 2)) == 2


def test_a_pickled_dataset_of_a_pipeline_that_stayed_put_runs(tokenizer: Any) -> None:
    pipeline = _build(tokenizer)
    dataset = pickle.loads(pickle.dumps(pipeline.to_torch()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(_ids(iter(dataset), 2)) == 2


def test_another_loader_of_a_pipeline_whose_first_loader_delivered_starts_at_its_state(
    tokenizer: Any,
) -> None:
    """Not refused: a loader made again from the pipeline (an epoch loop) starts where the
    pipeline stands, as it always did."""
    pipeline = _build(tokenizer)
    first = _ids(DataLoader(pipeline), 4)
    assert _ids(DataLoader(pipeline), 4) == first


@pytest.mark.parametrize(
    ("argument", "said"),
    [
        ({"batch_size": 8}, r"`batch_size` is not taken: .*`\.batch\(microbatch_size\)`"),
        ({"shuffle": True}, r"`shuffle` is not taken: the pipeline decides the order"),
        ({"drop_last": True}, "`drop_last` is not taken: a finite stream ends with padded"),
        ({"workers": 2}, "`workers` is not taken: not an argument of zephon_torch"),
        ({"in_order": False}, "`in_order` is not taken: items come in the one order"),
    ],
)
def test_torch_loader_arguments_the_loader_decides_are_refused_saying_why(
    tokenizer: Any, argument: dict[str, Any], said: str
) -> None:
    """They were Python's bare TypeError (an unexpected keyword argument)."""
    with pytest.raises(ConfigError, match=said):
        DataLoader(_build(tokenizer), **argument)


def _started(folder: str, worker_id: int) -> None:
    """A `worker_init_fn`: marks the worker in `folder`, and draws from torch's generator
    (which cannot change the data)."""
    torch.rand(1)
    with open(f"{folder}/{worker_id}", "w") as mark:
        mark.write("started")


def test_a_worker_init_fn_runs_in_each_worker_and_leaves_the_data_as_it_is(
    tokenizer: Any, tmp_path: Path
) -> None:
    """It was refused as no argument of the loader, though training code often passes one
    (a walkthrough's doubt)."""
    plain = _ids(DataLoader(_build(tokenizer), num_workers=2), 6)
    started = functools.partial(_started, str(tmp_path))
    loader = DataLoader(_build(tokenizer), num_workers=2, worker_init_fn=started)
    assert _ids(loader, 6) == plain
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0", "1"]


def _meta_default(worker_id: int) -> None:
    """A `worker_init_fn` setting the default device, as a worker forked from a script that
    set `torch.set_default_device("cuda")` has it (the meta device stands in for a GPU)."""
    torch.set_default_device("meta")


def test_workers_under_another_default_device_still_deliver_cpu_batches(
    tokenizer: Any,
) -> None:
    """Each worker made its micro-batch's max_seqlen and transfer buffer on the default
    device: on a GPU a forked worker cannot start CUDA, and no batch came."""
    plain = [
        {k: v for k, v in item.items() if isinstance(v, torch.Tensor)}
        for _, item in zip(range(4), DataLoader(_build(tokenizer).to_torch(attention_mask=True)))
    ]
    loader = DataLoader(
        _build(tokenizer).to_torch(attention_mask=True), num_workers=2, worker_init_fn=_meta_default
    )
    delivered = [item for _, item in zip(range(4), loader)]
    assert len(delivered) == len(plain) == 4
    for want, got in zip(plain, delivered, strict=True):
        assert all(torch.equal(got[k], v) and got[k].device.type == "cpu" for k, v in want.items())
