"""Saved state sizes: as written (packed) against the same state with its lanes as lists.

A state is written with a bin packer's open rows packed and each lane's per-source part (reader
positions, delivered counts, flags, carried pieces) as one packed string
(`zephon_torch._packed_rows`); inside the pipeline both are lists, as version 2 wrote them.
This script builds in-memory corpora of short random English-like documents, runs each recipe
a few steps, and prints `len(json.dumps(state))` both ways (DESIGN.md section 4: at most 64 KiB
with 64 lanes):

- `wrap` with `--sources` datasets (default 2, 10, 20 and 40) on 64 lanes after 3 steps, and
  the same state with its counts grown as in a long run: every reader position and delivered
  count times `--grow` (100,000 by default: 6 x 10^8 tokens a lane, 4 x 10^10 over the 64
  lanes, a mid-sized run), since the packed size depends on the numbers' sizes;
- `best_fit` with 8 bins of 4,096 tokens on 2 lanes after 20 steps, on documents of 1-4,
  5-12 and 50-400 words (`--bin-docs` documents each; 400,000 by default, so the rows fill),
  and on 64 lanes after one step on the documents of 1-4 words (read again as needed).

    .venv/bin/python benchmarks/state_size.py [--sources 2 10 20 40] [--grow 100000]
        [--bin-docs 400000]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import tempfile
from typing import Any

from zephon_torch import Pipeline
from zephon_torch._corpus import small_tokenizer
from zephon_torch._packed_rows import pack_lanes, unpack_lanes
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource, TokenEstimation

_WORDS = "the a of to and in is it that for on with as was by at data model loss".split()  # noqa: SIM905


def _documents(rng: random.Random, count: int, low: int, high: int) -> list[dict[str, str]]:
    return [
        {"text": " ".join(rng.choice(_WORDS) for _ in range(rng.randint(low, high)))}
        for _ in range(count)
    ]


def _state(pipeline: Pipeline, batches: int) -> dict[str, Any]:
    """The state after ``batches`` micro-batches, as written."""
    stream = iter(pipeline)
    for done in range(batches):
        if next(stream, None) is None:
            raise SystemExit(
                f"the data ended after {done} of the {batches} micro-batches a state is taken "
                "after: raise --bin-docs"
            )
    return pipeline.state_dict()


def _sizes(state: dict[str, Any]) -> tuple[int, int]:
    """``state``'s size as written and with its lanes as lists."""
    return len(json.dumps(state)), len(json.dumps({**state, "lanes": unpack_lanes(state["lanes"])}))


def _grown(state: dict[str, Any], factor: int) -> dict[str, Any]:
    """``state`` with every reader position and delivered count times ``factor`` (and a
    seeded jitter below it, so the low digits are not zeros), written packed again."""
    rng = random.Random(1)
    lanes = unpack_lanes(state["lanes"])
    for lane in lanes.values():
        pack = lane["pack"]
        for reader in pack["readers"]:
            reader["pos"] = reader["pos"] * factor + rng.randrange(factor)
        pack["delivered"] = [
            [t * factor + rng.randrange(factor), d * factor + rng.randrange(factor)]
            for t, d in pack["delivered"]
        ]
        lane["turn"] *= factor
    return {**state, "lanes": pack_lanes(lanes)}


def _row(label: str, sizes: tuple[int, int]) -> None:
    written, lists = sizes
    print(
        f"{label:<52} {written / 1024:8.1f} KiB  {lists / 1024:8.1f} KiB  x{lists / written:5.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sources", type=int, nargs="+", default=[2, 10, 20, 40])
    parser.add_argument("--grow", type=int, default=100_000)
    parser.add_argument("--bin-docs", type=int, default=400_000)
    args = parser.parse_args()
    tokenizer: Any = small_tokenizer(pathlib.Path(tempfile.mkdtemp()) / "tokenizer.json")
    rng = random.Random(0)
    print(f"{'recipe':<52} {'written':>12}  {'as lists':>12}  ratio")
    for count in args.sources:
        datasets = [
            Dataset.from_dict(f"source_{i}", _documents(rng, 1500, 20, 300), shard_size=100)
            for i in range(count)
        ]
        source = StaticMixtureWorkSource(
            datasets,
            {d.name: 1 + i for i, d in enumerate(datasets)},
            seed=1,
            token_estimation=TokenEstimation(),
            exhaustion="repeat",
        )
        pipeline = (
            Pipeline(source)
            .options(canonical_replicas=64)
            .tokenize(tokenizer=tokenizer)
            .pack_flat(2048, "wrap")
            .batch(1)
        )
        state = _state(pipeline, 64 * 3)
        _row(f"wrap, {count} sources, 64 lanes, 3 steps", _sizes(state))
        _row(f"  counts x {args.grow:,}", _sizes(_grown(state, args.grow)))
    for low, high in ((1, 4), (5, 12), (50, 400)):
        dataset = Dataset.from_dict("d", _documents(rng, args.bin_docs, low, high))
        pipeline = (
            Pipeline(StaticMixtureWorkSource([dataset], seed=1))
            .options(canonical_replicas=2)
            .tokenize(tokenizer=tokenizer)
            .pack_flat(4096, "best_fit", num_bins=8)
            .batch(8)
        )
        label = f"best_fit 8 x 4096, {low}-{high} words, 2 lanes, 20 steps"
        _row(label, _sizes(_state(pipeline, 2 * 20)))
        if (low, high) == (1, 4):  # the shared design's 64 lanes, on the documents costing most
            source = StaticMixtureWorkSource([dataset], seed=1, exhaustion="repeat")
            pipeline = (
                Pipeline(source)
                .options(canonical_replicas=64)
                .tokenize(tokenizer=tokenizer)
                .pack_flat(4096, "best_fit", num_bins=8)
                .batch(8)
            )
            label = f"best_fit 8 x 4096, {low}-{high} words, 64 lanes, 1 step"
            _row(label, _sizes(_state(pipeline, 64)))


if __name__ == "__main__":
    main()
