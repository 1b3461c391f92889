"""`zephon_torch.torch.DataLoader.stats()`: what the loop received, counted in the loop's
process, against `Pipeline.stats()` of the same recipe."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.helpers import LOADER_DATASETS, loader_pipeline, take
from zephon_torch import Pipeline
from zephon_torch.torch import DataLoader
from zephon_torch.work import StaticMixtureWorkSource, TokenEstimation


def skipping(tokenizer: Any) -> Pipeline:
    """Two sources on 4 lanes, where the length rules skip documents of both kinds."""
    source = StaticMixtureWorkSource(
        LOADER_DATASETS, {"long": 0.6, "short": 0.4}, seed=7, token_estimation=TokenEstimation()
    )
    return (
        Pipeline(source)
        .options(canonical_replicas=4)
        .tokenize(tokenizer=tokenizer, parallelism=2)
        .pack_flat(256, "best_fit", long_documents="drop", min_document_length=12)
        .batch(2)
    )


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_stats_count_what_the_loop_received_as_the_pipeline_counts_it(
    tokenizer: Any, num_workers: int
) -> None:
    reference = skipping(tokenizer)
    whole = list(reference)
    expected = reference.stats()
    assert expected["skipped_documents"]["too_long"] and expected["skipped_documents"]["too_short"]
    loader = DataLoader(
        skipping(tokenizer), num_workers=num_workers, multiprocessing_context="fork"
    )
    items = []
    for item in loader:
        items.append(item)
        if len(items) == 5:
            early = loader.stats()
    stats = loader.stats()
    assert len(items) == len(whole) and early["batches"] == 5
    assert early["tokens"] == sum(batch.num_tokens for batch in whole[:5])
    for key in ("batches", "tokens", "tokens_by_source", "delivered_shares", "target_shares",
                "padding_fraction", "skipped_documents", "shares_of", "token_shares"):  # fmt: skip
        assert stats[key] == expected[key], key
    assert stats["operators"] is None and stats["stalls"]["packer_waited_for_documents_s"] is None
    assert stats["state_bytes"] == len(json.dumps(loader.state_dict()))
    assert 0 < stats["stalls"]["consumer_waited_s"] <= stats["elapsed_s"]


def test_loader_stats_of_a_resumed_run_count_skips_from_the_run_s_start(tokenizer: Any) -> None:
    reference = skipping(tokenizer)
    list(reference)
    first = DataLoader(skipping(tokenizer), num_workers=2, multiprocessing_context="fork")
    received = take(first, 7)
    resumed = DataLoader(skipping(tokenizer), num_workers=2, multiprocessing_context="fork")
    resumed.load_state_dict(first.state_dict())
    rest = take(resumed)
    stats = resumed.stats()
    assert (
        stats["batches"] == len(rest) and len(received) + len(rest) == reference.stats()["batches"]
    )
    assert stats["skipped_documents"] == reference.stats()["skipped_documents"]


def test_loader_stats_after_a_break_stay_as_they_were_with_the_state_s_size(
    tokenizer: Any,
) -> None:
    """The loop's clock ran on after a `break` (a step budget's end): tokens/s fell towards 0
    the longer stats() was called after the loop. The state's size counted a state of step 0,
    digits short from step 10 on."""
    loader = DataLoader(loader_pipeline(tokenizer, lanes=1, exhaustion="repeat"))
    for step, _ in enumerate(loader):
        if step == 11:
            break
    stats = loader.stats()
    time.sleep(0.3)
    assert loader.stats() == stats and stats["batches"] == 12
    assert loader.state_dict()["step"] == 12
    assert stats["state_bytes"] == len(json.dumps(loader.state_dict()))


def test_loader_stats_follow_options_stats_false(tokenizer: Any) -> None:
    """It counts nothing, as `Pipeline.stats()` does for the option (it counted all)."""
    pipeline = loader_pipeline(tokenizer, lanes=1, exhaustion="repeat").options(stats=False)
    loader = DataLoader(pipeline)
    assert len(take(loader, 5)) == 5
    stats = loader.stats()
    assert (stats["batches"], stats["tokens"], stats["tokens_by_source"]) == (0, 0, {})
