"""Remote with prefetch vs local: the same pipeline over S3 (moto on loopback) and a local copy.

The demo corpus, tokenized once by `pretokenized.py`'s code (demo tokenizer, no EOS), is stored
as Parquet `list<int32>` shards (no dictionary pages, zstd: the fastest Parquet layout there)
and uploaded to a moto S3 server this script starts on 127.0.0.1 and stops at the end. The
pipeline is `pretokenized("input_ids").pack_flat(2048, "wrap").batch(8)`, one pass, touching
every `batch.input_ids`: pre-tokenized, so reading is a larger part of the time than with
online tokenization and a slow download would show. Measured, interleaved, in the same run:

- local: `Dataset.from_path` on the local folder;
- remote: `s3://` with a fresh node-local shard cache in a temporary folder each time, the
  library's default prefetch (the read stage asks the dataset to download upcoming shards);
- remote, no prefetch: the same with `io_options={"cache": {"prefetch_bytes": 0}}`, which drops
  every prefetch request, so each shard is downloaded by the read that first needs it.

Times include opening the dataset (remote: listing and Parquet footers by range reads). Target:
remote with prefetch at least 0.8 of local (best of `--repeats`). Loopback only; the run stops
by itself (a deadline skips the remaining repeats). Exit code 0 whether or not the target is met.

    .venv/bin/python benchmarks/remote.py [--repeats 3] [--shards 16] [--budget-s 150]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import boto3
from pretokenized import pipeline_tokens, tokenized_corpus, write_parquet

from zephon_torch import Pipeline
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource

TARGET_RATIO = 0.8
_SEQ = 2048
_BATCH = 8
_BUCKET = "bench"
_PREFIX = "tokens"
_MISMATCH_EXIT = 2
_SERVER_START_S = 30.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_moto() -> tuple[str, subprocess.Popen[bytes]]:
    """Starts `moto.server` on a free loopback port; returns its endpoint and process."""
    port = _free_port()
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x"}
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    deadline = time.monotonic() + _SERVER_START_S
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return f"http://127.0.0.1:{port}", server
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                raise SystemExit("the moto server did not start") from None
            time.sleep(0.1)


def storage_options(endpoint: str) -> dict[str, Any]:
    return {
        "key": "x",
        "secret": "x",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        "skip_instance_cache": True,
    }


def upload(endpoint: str, folder: pathlib.Path) -> int:
    """Uploads every file of `folder` under `s3://bench/tokens/`; returns the bytes sent."""
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="x",
        aws_secret_access_key="x",
        region_name="us-east-1",
    )
    client.create_bucket(Bucket=_BUCKET)
    sent = 0
    for file in sorted(folder.iterdir()):
        client.upload_file(str(file), _BUCKET, f"{_PREFIX}/{file.name}")
        sent += file.stat().st_size
    return sent


def build_pipeline(dataset: Dataset, lanes: int) -> Pipeline:
    source = StaticMixtureWorkSource([dataset], seed=0, exhaustion="stop")
    return (
        Pipeline(source)
        .options(canonical_replicas=lanes)
        .pretokenized("input_ids")
        .pack_flat(_SEQ, "wrap")
        .batch(_BATCH)
    )


def timed(open_dataset: Callable[[], Dataset], lanes: int) -> tuple[int, float, float]:
    """Opens the dataset and runs one pass; returns (tokens, seconds in all, seconds to open)."""
    start = time.perf_counter()
    dataset = open_dataset()
    opened = time.perf_counter() - start
    tokens = pipeline_tokens(build_pipeline(dataset, lanes))
    return tokens, time.perf_counter() - start, opened


def run(root: pathlib.Path, args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    docs = tokenized_corpus() * args.copies
    total = sum(d.size for d in docs)
    local_dir = root / "local"
    write_parquet(docs, local_dir, use_dictionary=False, compression="zstd", shards=args.shards)
    del docs
    endpoint, server = start_moto()
    try:
        sent = upload(endpoint, local_dir)
        print(
            f"{total:,} tokens in {args.shards} Parquet shards ({sent / 1e6:.1f} MB) uploaded to "
            f"moto at {endpoint} in {time.perf_counter() - t0:.1f} s",
            flush=True,
        )
        url = f"s3://{_BUCKET}/{_PREFIX}/"
        index_dir = str(root / "index")

        def local() -> Dataset:
            return Dataset.from_path(
                "tokens", local_dir, token_columns=["input_ids"], index_cache_dir=index_dir
            )

        def remote(prefetch: bool) -> Callable[[], Dataset]:
            def open_remote() -> Dataset:
                cache: dict[str, Any] = {"dir": tempfile.mkdtemp(dir=root, prefix="cache-")}
                if not prefetch:
                    cache["prefetch_bytes"] = 0
                return Dataset.from_path(
                    "tokens",
                    url,
                    token_columns=["input_ids"],
                    index_cache_dir=index_dir,
                    storage_options=storage_options(endpoint),
                    io_options={"cache": cache},
                )

            return open_remote

        sides: dict[str, Callable[[], Dataset]] = {
            "local": local,
            "remote+prefetch": remote(True),
            "remote, no prefetch": remote(False),
        }
        best: dict[str, float] = {}
        opens: dict[str, float] = {}
        iterate: dict[str, float] = {}
        deadline = time.monotonic() + args.budget_s
        done = 0
        for repeat in range(args.repeats):
            if repeat and time.monotonic() > deadline:
                print(f"time budget of {args.budget_s:.0f} s spent: stopping after {done} repeats")
                break
            line = []
            for name, open_dataset in sides.items():
                tokens, seconds, opened = timed(open_dataset, args.lanes)
                if tokens != total:
                    print(f"MISMATCH: {name} gave {tokens:,} tokens, expected {total:,}")
                    return _MISMATCH_EXIT
                if tokens / seconds > best.get(name, 0.0):
                    best[name], opens[name] = tokens / seconds, opened
                iterate[name] = max(iterate.get(name, 0.0), tokens / (seconds - opened))
                line.append(f"{name} {tokens / seconds / 1e6:.2f} M tok/s (open {opened:.2f} s)")
            done += 1
            print(f"repeat {repeat + 1}: " + ", ".join(line), flush=True)
    finally:
        server.kill()
        server.wait(10)
    print(
        f"\nsettings: lanes {args.lanes}, batch [{_BATCH}, {_SEQ}] int64 wrap, pretokenized "
        f"Parquet, {os.cpu_count()} cores, S3 = moto on loopback; best of {done}"
    )
    for name, rate in best.items():
        ratio = rate / best["local"]
        print(
            f"{name:<20}{rate / 1e6:8.2f} M tok/s  ratio {ratio:.3f}  (open {opens[name]:.2f} s; "
            f"after opening {iterate[name] / 1e6:.2f} M tok/s, ratio "
            f"{iterate[name] / iterate['local']:.3f})"
        )
    ratio = best["remote+prefetch"] / best["local"]
    verdict = "met" if ratio >= TARGET_RATIO else "not met"
    print(f"target {TARGET_RATIO} (remote+prefetch / local): {verdict} ({ratio:.3f})")
    after = iterate["remote+prefetch"] / iterate["local"]
    verdict = "met" if after >= TARGET_RATIO else "not met"
    print(f"target {TARGET_RATIO} after opening (no listing, footers): {verdict} ({after:.3f})")
    effect = best["remote+prefetch"] / best["remote, no prefetch"]
    print(f"prefetch effect (remote+prefetch / remote, no prefetch): {effect:.3f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--shards", type=int, default=32, help="Parquet shards uploaded")
    p.add_argument("--copies", type=int, default=8, help="times the tokenized corpus is repeated")
    p.add_argument("--lanes", type=int, default=1, help="canonical_replicas (L)")
    p.add_argument(
        "--budget-s", type=float, default=150.0, help="start no repeat after this many seconds"
    )
    args = p.parse_args(argv)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="zephon-remote-") as tmp:
        code = run(pathlib.Path(tmp), args)
    print(f"total wall time {time.perf_counter() - started:.1f} s")
    return code


if __name__ == "__main__":
    sys.exit(main())
