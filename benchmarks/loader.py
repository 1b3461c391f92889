"""DataLoader workers: items through one shared buffer vs torch's tensor-by-tensor transport.

The pre-tokenized `.npy` corpus of `pretokenized.py` (the demo corpus tokenized once, about 9 M
tokens, so the loader, not the data, is the cost) through `zephon_torch.torch.DataLoader` with
`--workers` worker processes (fork), one pass, L = 4 lanes, batches [8, 2048]. Measured in the
same run, interleaved:

- in-process: `Batch.to_training()` over the bare pipeline (no DataLoader): the ceiling;
- loader, 0 workers;
- loader, N workers, packed: each item's nine tensors in one shared-memory buffer (default);
- loader, N workers, per tensor: the same with packing switched off, so torch sends every
  tensor through its own segment and file descriptor (the baseline).

Tokens must agree (exit code 2 otherwise). Prints M tok/s and the packed / per-tensor ratio.

    .venv/bin/python benchmarks/loader.py [--workers 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import time
from collections.abc import Callable

from pretokenized import tokenized_corpus, write_npy

from zephon_torch import Pipeline
from zephon_torch.io import Dataset
from zephon_torch.torch import DataLoader
from zephon_torch.work import StaticMixtureWorkSource

_MISMATCH_EXIT = 2


def build(root: pathlib.Path) -> Pipeline:
    dataset = Dataset.from_path("tokens", root)
    source = StaticMixtureWorkSource([dataset], seed=0, exhaustion="stop")
    pipeline = Pipeline(source).options(canonical_replicas=4).pretokenized("input_ids")
    return pipeline.pack_flat(2048, "wrap").batch(8)


def in_process(root: pathlib.Path) -> int:
    return sum(int(batch.to_training()["num_valid_tokens"]) for batch in build(root))


def through_loader(root: pathlib.Path, workers: int, *, packed: bool) -> int:
    loader = DataLoader(
        build(root), num_workers=workers, multiprocessing_context="fork" if workers else None
    )
    loader._pack_transport = packed
    return sum(int(item["num_valid_tokens"]) for item in loader)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="zephon-loader-") as tmp:
        root = pathlib.Path(tmp) / "npy"
        write_npy(tokenized_corpus(), root)
        sides: dict[str, Callable[[], int]] = {
            "in-process to_training": lambda: in_process(root),
            "loader, 0 workers": lambda: through_loader(root, 0, packed=True),
            f"loader, {args.workers} workers, packed": lambda: through_loader(
                root, args.workers, packed=True
            ),
            f"loader, {args.workers} workers, per tensor": lambda: through_loader(
                root, args.workers, packed=False
            ),
        }
        best: dict[str, float] = {}
        expected: int | None = None
        for _ in range(args.repeats):
            for name, run in sides.items():
                start = time.perf_counter()
                tokens = run()
                rate = tokens / (time.perf_counter() - start)
                expected = tokens if expected is None else expected
                if tokens != expected:
                    print(f"MISMATCH: {name} gave {tokens:,} tokens, expected {expected:,}")
                    return _MISMATCH_EXIT
                best[name] = max(best.get(name, 0.0), rate)
    print(f"{expected:,} valid tokens per pass; best of {args.repeats}")
    for name, rate in best.items():
        print(f"  {name:<34}{rate / 1e6:8.2f} M tok/s")
    names = list(best)
    print(f"packed / per tensor: {best[names[2]] / best[names[3]]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
