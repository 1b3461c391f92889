"""Remote with prefetch vs local: the same pipeline over S3 (moto on loopback) and a local copy.

Two workloads, each a one-pass `pack_flat(2048, "wrap").batch(8)` pipeline over one dataset,
touching every `batch.input_ids`:

- `pretokenized`: the demo corpus tokenized once (`pretokenized.py`'s code, `--copies` times),
  stored as Parquet `list<int32>` shards (no dictionary pages, zstd), read with
  `.pretokenized("input_ids")`. Reading is almost all of the work here, so this is the worst
  case for remote storage;
- `text`: the demo corpus's stdlib-code JSONL shards, tokenized online with the demo tokenizer
  (the library's main job).

Each is uploaded to a moto S3 server this script starts on 127.0.0.1 (on the same cores as the
pipeline: serving bytes costs CPU the pipeline would otherwise use) and measured, interleaved:

- local: `Dataset.from_path` on the local folder;
- remote+prefetch: `s3://` with a fresh node-local shard cache each time and the library's
  default prefetch (readers ask the dataset to download the shards they read next, as far
  ahead as the cache's `prefetch_bytes` reaches);
- remote, no prefetch: the same with `io_options={"cache": {"prefetch_bytes": 0}}`, so each
  shard is downloaded by the read that first needs it;
- local beside a download (the control): the local pass while another process downloads
  every object of the prefix from the same server with s3fs's `get_file`, one after another,
  as a remote pass must: what the transfer alone costs the pass on these cores, with nothing
  of the library's remote path in it. remote+prefetch over this side is printed too: near 1,
  the library adds nothing to the remote pass beyond the transfer's CPU; well under 1, its
  remote path (prefetch, cache, waits) is what loses.

Each side's indexes (JSONL line indexes, remembered row counts) are built once before the timed
passes, as `zephon-torch index` does ahead of a job, so a timed open lists the objects and
downloads nothing; times include that open. Each remote pass starts with an empty shard cache,
so every shard is downloaded during the pass, and every pass after a `gc.collect()`. Target:
remote+prefetch at least 0.8 of local (best of `--repeats`), judged twice: on the streaming rate
after opening (what a long run sees) and on the whole pass with its cold open (which weighs by
how short the pass is: `--copies` sets the pre-tokenized pass length, 24 copies being about 1.5
s locally). Each best pass's CPU seconds are printed too (this process, all threads, and the
server's): on a machine whose cores the local pass already keeps busy, what a remote pass adds
(the downloads' writes into the page cache, most of it) comes out of the same cores.
Loopback only; the run stops by itself (a deadline skips the remaining repeats). Exit code 0
whether or not the target is met; 2 when a side delivers another token count than local.

    .venv/bin/python benchmarks/remote.py [--workload both] [--repeats 3] [--budget-s 150]
"""

from __future__ import annotations

import argparse
import gc
import os
import pathlib
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pretokenized import pipeline_tokens, tokenized_corpus, write_parquet

from zephon_torch import Pipeline
from zephon_torch._corpus import demo_corpus, demo_tokenizer
from zephon_torch._moto import moto_server, upload
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource

TARGET_RATIO = 0.8
_SEQ = 2048
_BATCH = 8
_BUCKET = "bench"
_MISMATCH_EXIT = 2
_SERVER_START_S = 30.0
_CONTROL = "local beside a download"


def storage_options(endpoint: str) -> dict[str, Any]:
    return {
        "key": "x",
        "secret": "x",
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        "skip_instance_cache": True,
    }


@dataclass(frozen=True)
class Workload:
    """One pipeline over one dataset, stored locally in `folder` and uploaded under `prefix`."""

    name: str
    folder: pathlib.Path
    prefix: str
    open_options: dict[str, Any]
    build: Callable[[Pipeline], Pipeline]  # adds the token stage


def pretokenized_workload(root: pathlib.Path, args: argparse.Namespace) -> Workload:
    docs = tokenized_corpus() * args.copies
    folder = root / "tokens"
    write_parquet(docs, folder, use_dictionary=False, compression="zstd", shards=args.shards)
    return Workload(
        name="pretokenized",
        folder=folder,
        prefix="tokens",
        open_options={"token_columns": ["input_ids"]},
        build=lambda pipeline: pipeline.pretokenized("input_ids"),
    )


def text_workload(root: pathlib.Path, args: argparse.Namespace) -> Workload:
    code_dir, _ = demo_corpus()
    folder = root / "text"
    folder.mkdir()
    for file in sorted(code_dir.glob("part-*.jsonl")):
        shutil.copyfile(file, folder / file.name)
    tokenizer, _ = demo_tokenizer()
    return Workload(
        name="text",
        folder=folder,
        prefix="text",
        open_options={},
        build=lambda pipeline: pipeline.tokenize(tokenizer=tokenizer),
    )


def run_pass(workload: Workload, dataset: Dataset, args: argparse.Namespace) -> int:
    source = StaticMixtureWorkSource([dataset], seed=0, exhaustion="stop")
    options = {"canonical_replicas": args.lanes, "prefetch": args.prefetch}
    pipeline = workload.build(Pipeline(source).options(**options))
    return pipeline_tokens(pipeline.pack_flat(_SEQ, "wrap").batch(_BATCH))


def download_all(endpoint: str, url: str, folder: str) -> None:
    """The control's other process: lists `url`, says `ready`, waits for a line on stdin, then
    downloads every object into `folder` one after another and prints its seconds and CPU."""
    import fsspec

    fs = fsspec.filesystem("s3", **storage_options(endpoint))
    paths = fs.find(url)
    print("ready", flush=True)
    sys.stdin.readline()
    start, used = time.perf_counter(), cpu_seconds()
    for path in paths:
        fs.get_file(path, os.path.join(folder, os.path.basename(path)))
    print(f"{time.perf_counter() - start:.3f} {cpu_seconds() - used:.3f}", flush=True)


class DownloadBeside:
    """The control's other process (`download_all`), started and listing: `go()` starts its
    downloads into `folder`, `finish()` waits for them and returns their seconds and CPU."""

    def __init__(self, endpoint: str, url: str, folder: pathlib.Path) -> None:
        folder.mkdir()
        command = [sys.executable, __file__, "--download-beside", endpoint, url, str(folder)]
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        if self._line() != "ready":
            self._failed()

    def go(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("go\n")
        self.process.stdin.flush()

    def finish(self) -> tuple[float, float]:
        report = self._line().split()
        if self.process.wait() or len(report) != 2:
            self._failed()
        seconds, used = map(float, report)
        return seconds, used

    def _line(self) -> str:
        assert self.process.stdout is not None
        return self.process.stdout.readline().strip()

    def _failed(self) -> None:
        self.process.kill()
        raise SystemExit(f"the control's download process failed (exit {self.process.wait()})")


def timed(
    workload: Workload, open_dataset: Callable[[], Dataset], args: argparse.Namespace
) -> tuple[int, float, float]:
    """Opens the dataset and runs one pass; returns (tokens, seconds in all, seconds to open)."""
    start = time.perf_counter()
    dataset = open_dataset()
    opened = time.perf_counter() - start
    tokens = run_pass(workload, dataset, args)
    return tokens, time.perf_counter() - start, opened


def cpu_seconds(pid: int | None = None) -> float:
    """User and system CPU seconds of this process (all its threads), or of process ``pid``
    (from /proc; NaN where there is none)."""
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(
    workload: Workload, endpoint: str, server: int, root: pathlib.Path, args: argparse.Namespace
) -> float:
    """Runs local, remote with prefetch and remote without, interleaved; prints the summary and
    returns the ratio remote+prefetch / local (best of the repeats)."""
    t0 = time.perf_counter()
    sent = upload(endpoint, workload.folder, _BUCKET, workload.prefix)
    shards = len(list(workload.folder.iterdir()))
    print(
        f"\n[{workload.name}] {shards} shards ({sent / 1e6:.1f} MB) uploaded in "
        f"{time.perf_counter() - t0:.1f} s",
        flush=True,
    )
    url = f"s3://{_BUCKET}/{workload.prefix}/"
    # each pass's shard cache folder, removed after it: its page cache is freed
    # for the next pass, as the cache's own eviction frees it in a long run (kept, every pass
    # would write its downloads into never-used memory, which costs this VM ~1.7 ms per MB)
    scratch = root / "scratch"
    # Indexes (JSONL line indexes, remembered row counts) are built once, untimed, as
    # `zephon-torch index` does ahead of a job: built at a timed open, a remote JSONL open
    # downloaded every shard, so the pass after it read local files only and measured nothing
    # remote (and prefetch had nothing to do).
    indexes = {"local": str(root / "index-local"), "remote": str(root / "index-remote")}
    Dataset.from_path(
        workload.name, workload.folder, index_cache_dir=indexes["local"], **workload.open_options
    )
    Dataset.from_path(
        workload.name,
        url,
        index_cache_dir=indexes["remote"],
        storage_options=storage_options(endpoint),
        io_options={"cache": {"dir": str(root / "index-downloads")}},
        **workload.open_options,
    )
    shutil.rmtree(root / "index-downloads", ignore_errors=True)  # Parquet: footers only

    def local() -> Dataset:
        return Dataset.from_path(
            workload.name,
            workload.folder,
            index_cache_dir=indexes["local"],
            **workload.open_options,
        )

    def remote(prefetch: bool) -> Callable[[], Dataset]:
        def open_remote() -> Dataset:
            cache: dict[str, Any] = {"dir": tempfile.mkdtemp(dir=scratch, prefix="cache-")}
            if not prefetch:
                cache["prefetch_bytes"] = 0
            return Dataset.from_path(
                workload.name,
                url,
                index_cache_dir=indexes["remote"],
                storage_options=storage_options(endpoint),
                io_options={"cache": cache},
                **workload.open_options,
            )

        return open_remote

    sides: dict[str, Callable[[], Dataset]] = {
        "local": local,
        "remote+prefetch": remote(True),
        "remote, no prefetch": remote(False),
        _CONTROL: local,
    }
    best: dict[str, float] = {}
    opens: dict[str, float] = {}
    # the best pass's CPU: ours, the server's, the control's download process's; its wall time
    cpu: dict[str, tuple[float, float, float, float]] = {}
    iterate: dict[str, float] = {}
    expected: int | None = None
    deadline = time.monotonic() + args.budget_s
    done = 0
    for repeat in range(args.repeats):
        if repeat and time.monotonic() > deadline:
            print(f"time budget of {args.budget_s:.0f} s spent: stopping after {done} repeats")
            break
        line = []
        for name, open_dataset in sides.items():
            scratch.mkdir()
            beside = DownloadBeside(endpoint, url, scratch / "beside") if name == _CONTROL else None
            # each pass starts from a collected heap: a full collection (0.1-0.2 s here, over
            # the live objects of this process and the S3 clients of earlier opens) fell by
            # turns into one side's open, always the same side in this order
            gc.collect()
            used = cpu_seconds(), cpu_seconds(server)
            if beside is not None:
                beside.go()
            tokens, seconds, opened = timed(workload, open_dataset, args)
            downloaded, download_cpu = (0.0, 0.0) if beside is None else beside.finish()
            used = cpu_seconds() - used[0], cpu_seconds(server) - used[1]
            shutil.rmtree(scratch)
            expected = tokens if expected is None else expected
            if tokens != expected:
                print(f"MISMATCH: {name} gave {tokens:,} tokens, local gave {expected:,}")
                raise SystemExit(_MISMATCH_EXIT)
            if tokens / seconds > best.get(name, 0.0):
                best[name], opens[name] = tokens / seconds, opened
                cpu[name] = (*used, download_cpu, seconds)
            iterate[name] = max(iterate.get(name, 0.0), tokens / (seconds - opened))
            note = f"open {opened:.2f} s" if beside is None else f"download {downloaded:.2f} s"
            line.append(f"{name} {tokens / seconds / 1e6:.2f} M tok/s ({note})")
        done += 1
        print(f"repeat {repeat + 1}: " + ", ".join(line), flush=True)
    print(
        f"[{workload.name}] lanes {args.lanes}, batch [{_BATCH}, {_SEQ}] int64 wrap, "
        f"{expected:,} tokens, {os.cpu_count()} cores, S3 = moto on loopback; best of {done}"
    )
    for name, rate in best.items():
        ratio = rate / best["local"]
        print(
            f"  {name:<24}{rate / 1e6:8.2f} M tok/s  ratio {ratio:.3f}  (open "
            f"{opens[name]:.2f} s; after opening {iterate[name] / 1e6:.2f} M tok/s, ratio "
            f"{iterate[name] / iterate['local']:.3f})"
        )
    print("  CPU of each best pass (this process, all threads; the server's; the control's):")
    for name, (ours, served, download_cpu, wall) in cpu.items():
        print(
            f"    {name:<24}{ours:6.2f} s ({ours / wall:.2f} cores busy)"
            + ("" if name == "local" else f", server {served:.2f} s")
            + (f", download process {download_cpu:.2f} s" if name == _CONTROL else "")
        )
    ratio = best["remote+prefetch"] / best["local"]
    streaming = iterate["remote+prefetch"] / iterate["local"]
    for what, value in (("streaming, after opening", streaming), ("with the cold open", ratio)):
        verdict = "met" if value >= TARGET_RATIO else "not met"
        print(f"  target {TARGET_RATIO} (remote+prefetch / local), {what}: {verdict} ({value:.3f})")
    effect = best["remote+prefetch"] / best["remote, no prefetch"]
    print(f"  prefetch effect (remote+prefetch / remote, no prefetch): {effect:.3f}")
    control = best["remote+prefetch"] / best[_CONTROL]
    print(
        f"  remote+prefetch / {_CONTROL}: {control:.3f} (near 1: what the remote pass loses "
        f"is the transfer's CPU on these cores, not the library's remote path)"
    )
    return ratio


def run(root: pathlib.Path, args: argparse.Namespace) -> int:
    builders = {"pretokenized": pretokenized_workload, "text": text_workload}
    names = list(builders) if args.workload == "both" else [args.workload]
    workloads = [builders[name](root, args) for name in names]
    with moto_server() as (endpoint, server):
        ratios = {w.name: measure(w, endpoint, server.pid, root, args) for w in workloads}
    print("\nremote+prefetch / local: " + ", ".join(f"{k} {v:.3f}" for k, v in ratios.items()))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--download-beside"]:  # the control's other process (see DownloadBeside)
        download_all(*argv[1:])
        return 0
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workload", choices=("pretokenized", "text", "both"), default="both")
    p.add_argument("--shards", type=int, default=32, help="Parquet shards uploaded")
    p.add_argument("--copies", type=int, default=24, help="times the tokenized corpus is repeated")
    p.add_argument("--lanes", type=int, default=1, help="canonical_replicas (L)")
    p.add_argument(
        "--prefetch",
        type=lambda v: v if v == "auto" else int(v),
        default="auto",
        help="the pipeline's micro-batch prefetch: 'auto' (the library's default) or a number",
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=150.0,
        help="per workload, start no repeat after this many seconds",
    )
    args = p.parse_args(argv)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="zephon-remote-") as tmp:
        code = run(pathlib.Path(tmp), args)
    print(f"total wall time {time.perf_counter() - started:.1f} s")
    return code


if __name__ == "__main__":
    sys.exit(main())
