"""Big Parquet shards: shuffle windows of blocks against windows of whole shards, one run.

Writes `--shards` Parquet shards of a `list<int32>` token column, each holding about
`--shard-mib` MiB of row groups of about `--group-mib` MiB (documents of about `--doc-tokens`
tokens, ids drawn at random), as hub-converted shards are: hundreds of MB each. Then reads the
first `--batches` [8, 2048] batches of `Pipeline(...).pretokenized("ids").pack_flat(2048,
"wrap").batch(8)` twice over the same files, with the default row-group cache (256 MiB) and
window (4):

- **blocks** (the library's behaviour): shards above `WINDOW_BLOCK_BYTES` (32 MiB) are split
  into blocks of row groups, and a window holds 4 blocks (at most 256 MiB of groups);
- **whole shards** (the behaviour before blocks, forced here by raising `WINDOW_BLOCK_BYTES`
  above every shard): a window holds 4 whole shards, far more than the cache.

Both read the same shards in another order, up to `--batches` batches or `--max-seconds`,
whichever comes first (the time limit may stop whole shards long before its batches, as at
`--batches 10000 --max-seconds 20`: then the sides' token counts differ, and the rates are per
token read). Prints tokens/s of each, the row-group decodes per group read, and the ratio
blocks / whole shards; the ratio is the speed-up a user of such shards sees. Exit 0 always.

    .venv/bin/python benchmarks/parquet_windows.py [--shards 4] [--shard-mib 160] [--batches 2000]
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from zephon_torch import Pipeline
from zephon_torch.io import Dataset, parquet
from zephon_torch.io.parquet import ParquetReader
from zephon_torch.work import StaticMixtureWorkSource


def write_shards(root: pathlib.Path, args: argparse.Namespace) -> int:
    """Writes the shards; returns their total token count."""
    rng = np.random.default_rng(0)
    tokens_per_shard = (args.shard_mib << 20) // 4
    group_rows = max(1, (args.group_mib << 20) // 4 // args.doc_tokens)
    total = 0
    for shard in range(args.shards):
        lengths = rng.integers(args.doc_tokens // 2, args.doc_tokens * 3 // 2, size=1 << 20)
        count = int(np.searchsorted(np.cumsum(lengths), tokens_per_shard))
        offsets = np.zeros(count + 1, dtype=np.int32)
        np.cumsum(lengths[:count], out=offsets[1:])
        values = rng.integers(0, 50_000, size=int(offsets[-1]), dtype=np.int32)
        column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
        pq.write_table(
            pa.table({"ids": column}),
            root / f"part-{shard:02d}.parquet",
            row_group_size=group_rows,
            compression="none",
        )
        total += int(offsets[-1])
    return total


def read_batches(root: pathlib.Path, args: argparse.Namespace) -> tuple[int, float, int, int]:
    """Tokens, seconds, row-group decodes and the groups they covered for the first
    `--batches` batches; opening the dataset is outside the clock."""
    decodes: list[tuple[str, int]] = []
    decode: Callable[..., Any] = ParquetReader._decode

    def counted(self: ParquetReader, path: str, opened: Any, group: int) -> Any:
        decodes.append((path, group))
        return decode(self, path, opened, group)

    ParquetReader._decode = counted  # type: ignore[method-assign]
    try:
        dataset = Dataset.from_path("big", root, token_columns=["ids"])
        source = StaticMixtureWorkSource([dataset], seed=0, exhaustion="stop")
        pipeline = Pipeline(source).pretokenized("ids").pack_flat(2048, "wrap").batch(8)
        tokens = 0
        start = time.perf_counter()
        for number, batch in enumerate(pipeline):
            tokens += batch.num_tokens
            if number + 1 == args.batches or time.perf_counter() - start > args.max_seconds:
                break
        seconds = time.perf_counter() - start
    finally:
        ParquetReader._decode = decode  # type: ignore[method-assign]
    return tokens, seconds, len(decodes), len(set(decodes))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--shard-mib", type=int, default=160, help="row-group bytes per shard")
    p.add_argument("--group-mib", type=int, default=8, help="bytes per row group")
    p.add_argument("--doc-tokens", type=int, default=2000, help="mean document length")
    p.add_argument("--batches", type=int, default=2000, help="[8, 2048] batches per side")
    p.add_argument("--max-seconds", type=float, default=30, help="time limit per side")
    p.add_argument("--block-mib", type=float, nargs="*", default=[], help="(tuning) block sizes")
    args = p.parse_args(argv)
    default_block = parquet.WINDOW_BLOCK_BYTES
    with tempfile.TemporaryDirectory(prefix="zephon-pqwin-") as tmp:
        root = pathlib.Path(tmp)
        start = time.perf_counter()
        total = write_shards(root, args)
        print(
            f"wrote {args.shards} shards of {args.shard_mib} MiB ({total:,} tokens, row groups "
            f"of {args.group_mib} MiB) in {time.perf_counter() - start:.1f} s"
        )
        results = {}
        sides = [("blocks", default_block), ("whole shards", 1 << 62)]
        if args.block_mib:
            sides = [(f"{mib:g} MiB", int(mib * (1 << 20))) for mib in args.block_mib]
        for name, block in sides:
            parquet.WINDOW_BLOCK_BYTES = block
            try:
                tokens, seconds, decodes, groups = read_batches(root, args)
            finally:
                parquet.WINDOW_BLOCK_BYTES = default_block
            results[name] = tokens / seconds
            print(
                f"{name:<13} {tokens / seconds / 1e6:8.2f} M tok/s  ({tokens:,} tokens in "
                f"{seconds:.2f} s; {decodes} row-group decodes of {groups} groups, "
                f"{decodes / max(groups, 1):.1f} each)",
                flush=True,
            )
    if not args.block_mib:
        print(f"ratio blocks / whole shards: {results['blocks'] / results['whole shards']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
