"""What the always-on stats counters cost: the demo pipeline with ``stats`` on vs off, one run.

Builds the demo recipe once (corpus and tokenizer cached), then alternates fresh copies
with ``options(stats=True)`` and ``options(stats=False)`` over the same first ``--steps`` global
steps (timed from the first batch, so start-up is left out), ``--repeats`` times each, and
prints the median tokens/s of both and the overhead ``1 - on / off`` (target: under 2%).
End-to-end timings on a shared machine are noisy, so it also times the counter update alone
(``RunCounters.delivered`` on a real batch) as a share of the time the pipeline spends per
micro-batch: the precise figure. Exit code 0 either way (a benchmark, not a test).

    .venv/bin/python benchmarks/stats_overhead.py [--steps 40] [--repeats 5] [--lanes 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

from zephon_torch import Pipeline
from zephon_torch._stats import RunCounters
from zephon_torch.demo import demo_pipeline


def timed(pipeline: Pipeline, batches: int) -> tuple[float, int]:
    """Seconds and tokens of micro-batches 2..``batches`` of a fresh iteration: the clock
    starts at the first batch, so start-up (calibration, first read-ahead) is left out."""
    tokens = 0
    start = 0.0
    for i, batch in enumerate(pipeline):
        if i == 0:
            start = time.perf_counter()
            continue
        tokens += batch.num_tokens
        if i + 1 == batches:
            break
    return time.perf_counter() - start, tokens


def counter_cost(pipeline: Pipeline, repeats: int = 20_000) -> float:
    """Seconds one ``RunCounters.delivered`` call takes on a real micro-batch."""
    batch = next(iter(pipeline))
    counters = RunCounters()
    start = time.perf_counter()
    for _ in range(repeats):
        counters.delivered(batch, 0.0, 1)
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="global steps per iteration")
    parser.add_argument("--repeats", type=int, default=5, help="iterations per setting")
    parser.add_argument("--lanes", type=int, default=8, help="canonical_replicas (L)")
    parser.add_argument("--max-length", type=int, default=512)
    parser.add_argument("--microbatch-size", type=int, default=2)
    args = parser.parse_args()

    base = demo_pipeline(
        canonical_replicas=args.lanes,
        max_length=args.max_length,
        microbatch_size=args.microbatch_size,
    )
    batches = args.steps * args.lanes
    setting = {"on": True, "off": False}
    timed(base.options(stats=True), batches)  # warm-up: page cache, tokenizer, thread pools
    rates: dict[str, list[float]] = {"on": [], "off": []}
    for r in range(args.repeats):
        # Alternate which goes first so drift in machine load hits both alike. Each timing is
        # of a fresh copy, which starts at step 0 (iterating a pipeline again would go on
        # from where it stopped): both sides time the same steps.
        order = ["on", "off"] if r % 2 == 0 else ["off", "on"]
        for name in order:
            seconds, tokens = timed(base.options(stats=setting[name]), batches)
            rates[name].append(tokens / seconds)
    median = {name: statistics.median(values) for name, values in rates.items()}
    overhead = 1 - median["on"] / median["off"]
    per_batch = 1 / median["on"] * args.max_length * args.microbatch_size
    cost = counter_cost(base.options(stats=True))

    print(
        f"demo pipeline: L={args.lanes}, {args.microbatch_size} x {args.max_length} tokens per "
        f"micro-batch, {batches} micro-batches per iteration, {args.repeats} repeats"
    )
    for name in ("off", "on"):
        spread = ", ".join(f"{v:,.0f}" for v in rates[name])
        print(f"stats {name:3s}: median {median[name]:,.0f} tokens/s  ({spread})")
    print(f"end-to-end overhead (1 - on/off): {overhead:+.2%}  (noise: see the spread)")
    print(
        f"counter update: {cost * 1e6:.2f} us per micro-batch = {cost / per_batch:.4%} of the "
        f"{per_batch * 1e3:.2f} ms the pipeline spends per micro-batch (target < 2%)"
    )


if __name__ == "__main__":
    main()
