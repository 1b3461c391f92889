"""Reading only the fields a recipe uses: pre-tokenized Parquet that also holds the text and a
URL per row, read by the pipeline as it is (no `map` or `filter`: only the token column, as a
token column) against the same pipeline with an identity `map` first (which may read any
field, so every column is decoded, the ids as Python ints), in one run.

The demo corpus (code and prose) is tokenized once with the demo tokenizer and written as 8
Parquet shards of `input_ids` (`list<int32>`), `text` and `url`, row groups of 512 rows. Both
sides run `pretokenized("input_ids").pack_flat(2048, "wrap").batch(8)` over one pass (one
lane), interleaved per repeat, best of `--repeats`; their batches must be the same (exit code 2
otherwise). The ratio is the pipeline's tokens/s over the mapped one's. `--bad-rows skip` runs
both under `bad_rows="skip"` (a shard lacking a field is then read whole; these lack none).

    .venv/bin/python benchmarks/projection.py [--repeats 3] [--bad-rows raise]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import sys
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from zephon_torch import Pipeline
from zephon_torch._corpus import demo_corpus, demo_tokenizer
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource

_SHARDS = 8
_MISMATCH_EXIT = 2


def write_corpus(out: pathlib.Path) -> int:
    """The demo corpus as Parquet shards of ids, text and URL; returns the token count."""
    code_dir, prose_dir = demo_corpus()
    tokenizer, _ = demo_tokenizer()
    files = [p for folder in (code_dir, prose_dir) for p in sorted(folder.glob("part-*.jsonl"))]
    texts = [json.loads(line)["text"] for path in files for line in path.open() if line.strip()]
    ids = [e.ids for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
    out.mkdir(parents=True)
    size = -(-len(texts) // _SHARDS)
    for number, start in enumerate(range(0, len(texts), size)):
        part = slice(start, start + size)
        table = pa.table(
            {
                "input_ids": pa.array(ids[part], pa.list_(pa.int32())),
                "text": texts[part],
                "url": [f"https://example.com/doc/{start + i}" for i in range(len(ids[part]))],
            }
        )
        pq.write_table(table, out / f"part-{number:03d}.parquet", row_group_size=512)
    return sum(len(i) for i in ids)


def identity(row: dict[str, Any]) -> dict[str, Any]:
    return row


def one_pass(folder: pathlib.Path, *, mapped: bool, bad_rows: str) -> tuple[float, int, str]:
    """Seconds, tokens and a digest of the batches of one pass."""
    source = StaticMixtureWorkSource([Dataset.from_path("d", folder)], seed=0, exhaustion="stop")
    pipeline = Pipeline(source).options(bad_rows=bad_rows)
    if mapped:
        pipeline = pipeline.map(identity, name="identity")
    pipeline = pipeline.pretokenized("input_ids").pack_flat(2048, "wrap").batch(8)
    digest = hashlib.sha256()
    tokens = 0
    start = time.perf_counter()
    for batch in pipeline:
        digest.update(np.ascontiguousarray(batch.input_ids).tobytes())
        tokens += batch.num_tokens
    return time.perf_counter() - start, tokens, digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--bad-rows", choices=["raise", "skip"], default="raise")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="zephon-projection-") as tmp:
        folder = pathlib.Path(tmp) / "parquet"
        total = write_corpus(folder)
        best = {"as is": 0.0, "mapped": 0.0}
        digests = set()
        for repeat in range(args.repeats):
            line = []
            for name in ("as is", "mapped"):
                mapped = name == "mapped"
                seconds, tokens, digest = one_pass(folder, mapped=mapped, bad_rows=args.bad_rows)
                if tokens != total:
                    print(f"MISMATCH: {name} gave {tokens:,} tokens, expected {total:,}")
                    return _MISMATCH_EXIT
                digests.add(digest)
                best[name] = max(best[name], tokens / seconds)
                line.append(f"{name} {tokens / seconds / 1e6:.1f} M tok/s")
            print(f"repeat {repeat + 1}: " + ", ".join(line), flush=True)
        if len(digests) != 1:
            print("MISMATCH: the two sides gave other batches")
            return _MISMATCH_EXIT
    print(f"\n{total:,} tokens; best of {args.repeats}; bad_rows={args.bad_rows!r}")
    print(f"pipeline as is (reads input_ids only)  {best['as is'] / 1e6:8.1f} M tok/s")
    print(f"with an identity map (reads all)       {best['mapped'] / 1e6:8.1f} M tok/s")
    print(f"ratio {best['as is'] / best['mapped']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
