"""DataLoader workers' errors reach the loop with their type, fields and frames (forked or
spawned workers, torch's own loaders too), and what a loader cannot serve is refused saying why:
a lambda for spawned workers, a Pipeline given to torch's loader, another lane count,
persistent workers."""

from __future__ import annotations

import json
import multiprocessing
import warnings
from typing import Any

import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from tests.helpers import LOADER_DATASETS, loader_pipeline, take
from zephon_torch import ConfigError, DataError, Pipeline, StateMismatchError
from zephon_torch.errors import WorkerTraceback
from zephon_torch.io import Dataset
from zephon_torch.torch import DataLoader
from zephon_torch.work import StaticMixtureWorkSource


def test_a_lambda_in_a_pipeline_for_spawned_workers_is_a_config_error_saying_so(
    tokenizer: Any,
) -> None:
    """Spawned (or forkserver) workers get the pipeline pickled: a lambda gave pickle's bare
    AttributeError from inside torch."""
    source = StaticMixtureWorkSource(LOADER_DATASETS, seed=1)
    pipeline = (
        Pipeline(source)
        .map(lambda row: {**row, "text": row["text"].upper()})
        .tokenize(tokenizer=tokenizer)
        .pack_flat(64)
        .batch(2)
    )
    loader = DataLoader(pipeline, num_workers=1, multiprocessing_context="spawn")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's own note on the pickle error
        with pytest.raises(
            ConfigError, match=r"started by 'spawn' get the pipeline pickled.*lambda"
        ):
            next(iter(loader))
    assert take(DataLoader(pipeline, num_workers=1, multiprocessing_context="fork"), 1)


def test_a_pipeline_given_to_torch_s_own_loader_says_how_to_load_it(tokenizer: Any) -> None:
    """torch's DataLoader takes what is not an IterableDataset for a map-style dataset and
    asked a Pipeline for its length: a bare "object of type 'Pipeline' has no len()"."""
    pipeline = loader_pipeline(tokenizer)
    with pytest.raises(
        TypeError, match=r"zephon_torch\.torch\.DataLoader\(pipeline\).*batch_size=None"
    ):
        next(iter(torch.utils.data.DataLoader(pipeline)))
    assert pipeline and len(list(pipeline)) > 1  # truth and list() do not ask for a length
    item = next(
        iter(torch.utils.data.DataLoader(loader_pipeline(tokenizer).to_torch(), batch_size=None))
    )
    assert item["input_ids"].shape == (2, 64)


def test_a_state_from_eight_lanes_is_refused_by_a_four_lane_loader(tokenizer: Any) -> None:
    eight = DataLoader(loader_pipeline(tokenizer, lanes=8))
    take(eight, 3)
    with pytest.raises(StateMismatchError, match="canonical_replicas"):
        DataLoader(loader_pipeline(tokenizer, lanes=4)).load_state_dict(eight.state_dict())


def test_three_ranks_over_eight_lanes_are_refused_with_the_supported_list(tokenizer: Any) -> None:
    with pytest.raises(ConfigError, match=r"supported world sizes: \[1, 2, 4, 8\]"):
        loader_pipeline(tokenizer, lanes=8, world_size=3)


def test_a_data_error_in_a_worker_reaches_the_loop_as_a_data_error(
    tokenizer: Any, tmp_path: Any
) -> None:
    shard = tmp_path / "a.jsonl"
    shard.write_text("".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(9)))
    with shard.open("a") as out:
        out.write('{"text": "broken\n')
    source = StaticMixtureWorkSource([Dataset.from_path("web", shard)], shuffle=False)
    pipeline = Pipeline(source).options(canonical_replicas=2).tokenize(tokenizer=tokenizer)
    loader = DataLoader(
        pipeline.pack_flat(16).batch(1), num_workers=2, multiprocessing_context="fork"
    )
    with pytest.raises(DataError) as caught:
        list(loader)
    assert (caught.value.dataset, caught.value.shard, caught.value.row) == ("web", str(shard), 9)
    # stopped with the error: its frames hold torch's iterator, whose workers lived on
    # until the error was collected
    assert multiprocessing.active_children() == []


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_map_s_exception_reaches_the_loop_as_the_cause_with_its_frames(context: str) -> None:
    from tests.unit.test_runner_errors import refusing_pipeline

    loader = DataLoader(refusing_pipeline("inline"), num_workers=2, multiprocessing_context=context)
    with pytest.raises(DataError, match=r"row 1: map .* raised RowRefused") as caught:
        list(loader)
    cause = caught.value.__cause__
    assert type(cause).__name__ == "RowRefused" and str(cause) == "row 5 is refused"
    assert isinstance(cause.__cause__, WorkerTraceback)
    assert "in refuse_row_five" in str(cause.__cause__)


@pytest.mark.parametrize("kind", ["torch", "stateful"])
def test_a_plain_torch_loader_keeps_a_worker_s_data_error_type_and_fields(kind: str) -> None:
    """torch (and torchdata's StatefulDataLoader) re-raise a worker's error as
    `type(error)(traceback text)`: DataError accepts that, so `except DataError` still works
    there, and reads the dataset, shard and row back from the text."""
    import torch.utils.data

    docs = [[1, 2, 3]] * 8 + [[4, -5]]  # the last one holds an id outside [0, 2**31)
    source = StaticMixtureWorkSource([Dataset.from_dict("ids", {"ids": docs})], shuffle=False)
    pipeline = Pipeline(source).pretokenized("ids").pack_flat(4).batch(1)
    loader_class = torch.utils.data.DataLoader if kind == "torch" else StatefulDataLoader
    loader = loader_class(
        pipeline.to_torch(), batch_size=None, num_workers=1, multiprocessing_context="fork"
    )
    with pytest.raises(DataError, match=r"dataset 'ids', shard 'memory://ids/0', row 8") as caught:
        list(loader)
    # its own type, a DataError: an id out of range is no row's fault (IdOutOfRange)
    assert "Caught IdOutOfRange in DataLoader worker process 0" in str(caught.value)
    assert type(caught.value).__name__ == "IdOutOfRange" and not caught.value.rows_fault
    assert (caught.value.dataset, caught.value.shard, caught.value.row) == (
        "ids",
        "memory://ids/0",
        8,
    )


def test_worker_settings_are_ignored_without_workers(tokenizer: Any) -> None:
    """So a worker count can be set to 0 alone: `timeout` was a bare AssertionError from torch
    at the first batch."""
    reference = take(DataLoader(loader_pipeline(tokenizer)), 2)
    loader = DataLoader(
        loader_pipeline(tokenizer), timeout=30, prefetch_factor=4, multiprocessing_context="spawn"
    )
    assert take(loader, 2) == reference


def test_persistent_workers_are_refused(tokenizer: Any) -> None:
    with pytest.raises(ConfigError, match="persistent_workers"):
        DataLoader(loader_pipeline(tokenizer), num_workers=1, persistent_workers=True)
