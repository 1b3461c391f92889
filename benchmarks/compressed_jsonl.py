"""Compressed JSONL: reading a gzip or zstd shard against the same rows stored plain, one run.

One JSONL shard of `--megabytes` (default 200) of the demo corpus's code documents (repeated to
size) is written three ways: plain, gzip and zstd. Each phase runs in its own subprocess, with a
fresh shard cache and line-index folder, and reads every row once, in random chunks of 64 rows
(as pointer streams read a shard), through `Dataset.read_rows`:

- `open`: `Dataset.from_path` (a compressed shard is decompressed here, to count its lines);
- `read`: rows/s over the pass;
- `reopen`: `from_path` and the first chunk again, in a new process that finds the node's
  caches warm (line index, and decompressed shard where there is one): a later rank's or
  worker's time to its first rows;
- `private MiB`: the process's peak private (anonymous) memory above what it held before
  opening, from `/proc/self/status` (`RssAnon`, sampled at each chunk): memory that every rank
  and DataLoader worker reading the shard would hold once each.

The plain shard is the baseline: compressed rows/s are printed as a ratio to it. Exit code 0.

    .venv/bin/python benchmarks/compressed_jsonl.py [--megabytes 200] [--repeats 2]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np
import zstandard

from zephon_torch._corpus import demo_corpus
from zephon_torch.io import Dataset

_CHUNK_ROWS = 64
_KINDS = ("plain", "gzip", "zstd")


def write_shards(root: pathlib.Path, megabytes: int) -> int:
    """The three shards of the same lines; returns the row count."""
    code_dir, _ = demo_corpus()
    lines = [
        line
        for path in sorted(code_dir.glob("part-*.jsonl"))
        for line in path.read_bytes().splitlines(keepends=True)
        if line.strip()
    ]
    size = sum(map(len, lines))
    data = b"".join(lines * max(1, megabytes * (1 << 20) // size))
    for kind in _KINDS:
        (root / kind).mkdir()
    (root / "plain" / "a.jsonl").write_bytes(data)
    (root / "gzip" / "a.jsonl.gz").write_bytes(gzip.compress(data, compresslevel=6))
    (root / "zstd" / "a.jsonl.zst").write_bytes(zstandard.ZstdCompressor(level=3).compress(data))
    return data.count(b"\n")


def _anon_kib() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    return 0


def phase(root: str, kind: str, cache: str, reopen: bool) -> dict[str, float]:
    """In a subprocess: open, read every row in random chunks (or one chunk when `reopen`)."""
    os.environ["ZEPHON_TORCH_CACHE"] = cache
    options = {"cache": {"dir": os.path.join(cache, "shards")}}
    before = _anon_kib()
    start = time.perf_counter()
    dataset = Dataset.from_path(kind, os.path.join(root, kind), io_options=options)
    opened = time.perf_counter() - start
    rows = dataset.shards[0].num_rows
    order = np.random.default_rng(0).permutation(rows)
    chunks = [order[i : i + _CHUNK_ROWS] for i in range(0, rows, _CHUNK_ROWS)]
    peak, read = _anon_kib(), 0
    start = time.perf_counter()
    for chunk in chunks[:1] if reopen else chunks:
        read += len(dataset.read_rows(0, chunk))
        peak = max(peak, _anon_kib())
    seconds = time.perf_counter() - start
    return {
        "open": opened,
        "first": opened + seconds,
        "rows_s": read / seconds,
        "rows": read,
        "anon_mib": (peak - before) / 1024,
    }


def _run_phase(
    root: pathlib.Path, kind: str, cache: pathlib.Path, reopen: bool
) -> dict[str, float]:
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); from compressed_jsonl import phase; "
        "print(json.dumps(phase(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5] == '1')))"
    )
    here = str(pathlib.Path(__file__).parent)
    args = [sys.executable, "-c", code, here, str(root), kind, str(cache), "1" if reopen else "0"]
    out = subprocess.run(args, check=True, capture_output=True, text=True)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--megabytes", type=int, default=200, help="decompressed shard size")
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="zephon-cjsonl-") as tmp:
        root = pathlib.Path(tmp)
        rows = write_shards(root, args.megabytes)
        sizes = {k: next((root / k).iterdir()).stat().st_size >> 20 for k in _KINDS}
        print(f"{rows:,} rows; shard MiB: " + ", ".join(f"{k} {v}" for k, v in sizes.items()))
        best: dict[str, dict[str, float]] = {}
        for repeat in range(args.repeats):
            for kind in _KINDS:
                cache = root / f"cache-{kind}-{repeat}"
                first = _run_phase(root, kind, cache, reopen=False)
                again = _run_phase(root, kind, cache, reopen=True)
                if first["rows"] != rows:
                    print(f"MISMATCH: {kind} read {first['rows']} rows, expected {rows}")
                    return 2
                print(
                    f"repeat {repeat + 1} {kind:>5}: open {first['open']:.2f} s, "
                    f"{first['rows_s'] / 1e3:.0f} k rows/s, private +{first['anon_mib']:.0f} MiB; "
                    f"reopen {again['first']:.2f} s, private +{again['anon_mib']:.0f} MiB",
                    flush=True,
                )
                kept = best.setdefault(kind, first | {"reopen": again["first"]})
                if first["rows_s"] > kept["rows_s"]:
                    best[kind] = first | {"reopen": again["first"]}
        base = best["plain"]["rows_s"]
        print("\nbest of", args.repeats)
        for kind in _KINDS:
            b = best[kind]
            print(
                f"{kind:>5}: {b['rows_s'] / 1e3:7.0f} k rows/s "
                f"(ratio to plain {b['rows_s'] / base:.2f}), open {b['open']:.2f} s, "
                f"reopen {b['reopen']:.2f} s, private +{b['anon_mib']:.0f} MiB"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
