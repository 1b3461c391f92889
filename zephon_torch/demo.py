"""The main job on the embedded default: two real sources, a 50:50 token mix, packed batches.

Code is the standard library's ``.py`` files, prose the pydoc topics; the tokenizer is a byte-level
BPE trained on them once and cached, unless one is given (``tokenizer``, or ``tokenizer_id``: a hub
id or a local path, ``zephon-torch demo --tokenizer``). Prose is small (about 0.5 MB), so the
recipe repeats each dataset with a fresh shuffle every pass.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from zephon_torch._corpus import demo_corpus, demo_tokenizer
from zephon_torch.io import Dataset
from zephon_torch.pipeline import Pipeline
from zephon_torch.work import StaticMixtureWorkSource, TokenEstimation

__all__ = ["DEMO_MIXTURE", "DemoReport", "demo_pipeline", "run_demo"]

DEMO_MIXTURE = {"code": 0.5, "prose": 0.5}


def demo_pipeline(
    tokenizer: Any = None,
    *,
    tokenizer_id: str | None = None,
    canonical_replicas: int = 8,
    max_length: int = 2048,
    microbatch_size: int = 8,
    parallelism: int | None = None,
) -> Pipeline:
    """The demo recipe: stdlib code and pydoc prose, 50:50 by tokens, ``wrap`` packing."""
    code_dir, prose_dir = demo_corpus()
    if tokenizer is None and tokenizer_id is None:
        tokenizer, _ = demo_tokenizer()
    source = StaticMixtureWorkSource(
        [Dataset.from_path("code", code_dir), Dataset.from_path("prose", prose_dir)],
        DEMO_MIXTURE,
        seed=42,
        token_estimation=TokenEstimation(),
        exhaustion="repeat",
    )
    return (
        Pipeline(source)
        .options(canonical_replicas=canonical_replicas)
        .tokenize(tokenizer_id, tokenizer=tokenizer, field="text", parallelism=parallelism)
        .pack_flat(max_length, "wrap")
        .batch(microbatch_size)
    )


@dataclass
class DemoReport:
    """What the demo measured."""

    first_batch_shape: tuple[int, ...]
    steps: int
    tokens: int
    shares: dict[str, float]
    seconds: float
    time_to_first_batch: float
    state_bytes: int


def run_demo(pipeline: Pipeline, *, steps: int) -> DemoReport:
    """Run ``steps`` global steps (one micro-batch per lane each) and measure."""
    lanes = len(pipeline.lanes)
    totals = dict.fromkeys(DEMO_MIXTURE, 0)
    shape: tuple[int, ...] = ()
    first = 0.0
    start = time.perf_counter()
    for i, batch in enumerate(pipeline):
        if i == 0:
            first = time.perf_counter() - start
            shape = tuple(batch.to_training()["input_ids"].shape)
        for name, n in batch.tokens_by_source().items():
            totals[name] += n
        if i + 1 == steps * lanes:
            break
    seconds = time.perf_counter() - start
    tokens = sum(totals.values())
    return DemoReport(
        first_batch_shape=shape,
        steps=steps,
        tokens=tokens,
        shares={k: v / max(1, tokens) for k, v in totals.items()},
        seconds=seconds,
        time_to_first_batch=first,
        state_bytes=len(json.dumps(pipeline.state_dict())),
    )
