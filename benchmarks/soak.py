"""Memory of long `exhaustion="repeat"` runs: growth per 100k micro-batches, per configuration.

Small local data (random token ids as `.npy`, pydoc prose cut into JSONL documents; hundreds of
passes a minute) through `pack_flat(64, "wrap")` and `batch(2)`, one lane (two through the
DataLoader), `state_dict()` every 50 micro-batches and `stats()` every 500, as a loop would:

- `npy`: one pre-tokenized dataset; `npy-mix`: two, 70:30; `text-mix`: two JSONL datasets,
  60:40, tokenized online (threads runner);
- `loader`: `npy-mix` through `zephon_torch.torch.DataLoader`, 2 fork workers (their RSS too);
- `resume`: `load_state_dict(state)` then 10 micro-batches, over and over (per 100k restores).

Each sample is taken after `gc.collect()`, with the library's bounded pure caches emptied first
(permutation round keys, 1,024 entries of about 370 B; pass layouts, 4 a dataset of O(shards)): they
fill over the first million micro-batches here and would read as growth. Growth is the
least-squares slope of RSS (`/proc/PID/statm`) and of gc-tracked objects over the samples after
the first third. Online tokenization's read-ahead moves RSS by a few MiB and objects by
about a thousand up and down, so judge a short run of `text-mix` by its end against its
middle; through the loader, torch's cache of shared storages comes and goes by about a hundred
objects. `--trace` adds tracemalloc's top growing sites (about 5x slower; RSS and objects then
count tracemalloc's own). Exit code 0.

    .venv/bin/python benchmarks/soak.py [--seconds 40] [--configs npy text-mix ...] [--trace]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import itertools
import os
import pathlib
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

from zephon_torch import Pipeline
from zephon_torch._corpus import pydoc_prose_documents, small_tokenizer, write_jsonl_shards
from zephon_torch.io import Dataset
from zephon_torch.torch import DataLoader
from zephon_torch.work import StaticMixtureWorkSource, TokenEstimation
from zephon_torch.work._permutation import _round_keys
from zephon_torch.work.pointers import _pass_layout

CONFIGS = ("npy", "npy-mix", "text-mix", "loader", "resume")
_PAGE = os.sysconf("SC_PAGE_SIZE")
_LIBC = ctypes.CDLL(None)  # glibc's malloc_trim
_PER = 100_000
_SAMPLES = 24
_WARM = _SAMPLES // 3  # samples before this one are warm-up


def rss(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def children() -> list[int]:
    """This process's child processes (DataLoader workers)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            if parent == os.getpid():
                found.append(int(entry))
    return sorted(found)


def write_npy(folder: pathlib.Path, docs: int, seed: int) -> pathlib.Path:
    """``docs`` documents of 5-199 random ids in 4 token files with offsets."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    for number, lengths in enumerate(np.array_split(rng.integers(5, 200, docs), 4)):
        np.save(folder / f"{number}.npy", rng.integers(0, 30_000, lengths.sum(), dtype=np.int32))
        np.save(folder / f"{number}.offsets.npy", np.concatenate([[0], np.cumsum(lengths)]))
    return folder


def write_text(folder: pathlib.Path, docs: int, words: tuple[int, int], seed: int) -> pathlib.Path:
    """``docs`` JSONL documents, runs of ``words`` words of pydoc prose, in 4 shards."""
    prose = " ".join(d["text"] for d in pydoc_prose_documents()).split()
    rng = np.random.default_rng(seed)
    texts = []
    for _ in range(docs):
        n = int(rng.integers(*words))
        start = int(rng.integers(0, len(prose) - n))
        texts.append({"text": " ".join(prose[start : start + n])})
    write_jsonl_shards(texts, folder, num_shards=4)
    return folder


@dataclass
class Recipes:
    root: pathlib.Path
    built: dict[str, Any] = field(default_factory=dict)

    def _source(self, datasets: list[Dataset], mixture: dict[str, float] | None) -> Any:
        return StaticMixtureWorkSource(
            datasets,
            mixture,
            seed=3,
            token_estimation=TokenEstimation(),
            exhaustion="repeat",
        )

    def npy(self, *, mixed: bool, lanes: int = 1) -> Pipeline:
        if "npy" not in self.built:
            self.built["npy"] = [
                Dataset.from_path("a", write_npy(self.root / "npy-a", 3000, 1)),
                Dataset.from_path("b", write_npy(self.root / "npy-b", 1000, 2)),
            ]
        a, b = self.built["npy"]
        source = self._source([a, b], {"a": 0.7, "b": 0.3}) if mixed else self._source([a], None)
        pipeline = Pipeline(source).options(canonical_replicas=lanes).pretokenized("input_ids")
        return pipeline.pack_flat(64, "wrap").batch(2)

    def text(self) -> Pipeline:
        if "text" not in self.built:
            self.built["text"] = (
                Dataset.from_path("a", write_text(self.root / "text-a", 1500, (5, 150), 5)),
                Dataset.from_path("b", write_text(self.root / "text-b", 800, (1, 40), 6)),
                small_tokenizer(self.root / "tokenizer.json"),
            )
        a, b, tokenizer = self.built["text"]
        return (
            Pipeline(self._source([a, b], {"a": 0.6, "b": 0.4}))
            .options(canonical_replicas=1)
            .tokenize(tokenizer=tokenizer, field="text", parallelism=2)
            .pack_flat(64, "wrap")
            .batch(2)
        )


class Sample(NamedTuple):
    """One sample; ``objects`` leaves out the samples held before it."""

    done: int  # micro-batches (or restores) so far
    rss: int
    objects: int
    workers: tuple[int, ...]
    snapshot: tracemalloc.Snapshot | None


def sample(count: int, held: int, workers: bool, *, snapshot: bool = False) -> Sample:
    _round_keys.cache_clear()
    _pass_layout.cache_clear()
    gc.collect()
    _LIBC.malloc_trim(0)  # freed heap back to the system: RSS then follows what is held
    worker_rss = tuple(rss(pid) for pid in children()) if workers else ()
    taken = tracemalloc.take_snapshot() if snapshot and tracemalloc.is_tracing() else None
    return Sample(count, rss(), len(gc.get_objects()) - held, worker_rss, taken)


def slope(xs: list[int], ys: list[int]) -> float:
    """Least-squares growth of ``ys`` per ``_PER`` of ``xs``."""
    return float(np.polyfit(np.array(xs, float), np.array(ys, float), 1)[0]) * _PER


def soak(
    steps: Iterator[Any],
    *,
    seconds: float,
    save: Callable[[], Any],
    stats: Callable[[], Any],
    workers: bool = False,
) -> list[Sample]:
    """Run ``steps`` for ``seconds``, sampling ``_SAMPLES`` times (where tracing, a
    tracemalloc snapshot at the end of warm-up and at the end); each step a micro-batch or a
    restore."""
    samples = [sample(0, 0, workers)]
    start = time.perf_counter()
    for count in itertools.count(1):
        next(steps)
        if count % 50 == 0:
            save()
        if count % 500 == 0:
            stats()
        due = len(samples) * seconds / _SAMPLES
        if count % 100 == 0 and time.perf_counter() - start >= due:
            snapshot = len(samples) in (_WARM, _SAMPLES)
            samples.append(sample(count, len(samples), workers, snapshot=snapshot))
            if len(samples) > _SAMPLES:
                return samples
    raise AssertionError("unreachable")


def restores(pipeline: Pipeline) -> Iterator[None]:
    """Endless restores of one state, each followed by 10 micro-batches."""
    batches = iter(pipeline)
    for _ in range(200):
        next(batches)
    state = pipeline.state_dict()
    while True:
        pipeline.load_state_dict(state)
        batches = iter(pipeline)
        for _ in range(10):
            next(batches)
        yield


def run(name: str, recipes: Recipes, seconds: float) -> list[Sample]:
    if name == "loader":
        loader = DataLoader(
            recipes.npy(mixed=True, lanes=2), num_workers=2, multiprocessing_context="fork"
        )
        return soak(
            iter(loader), seconds=seconds, save=loader.state_dict, stats=loader.stats, workers=True
        )
    if name == "resume":
        pipeline = recipes.npy(mixed=True)
        return soak(restores(pipeline), seconds=seconds, save=lambda: None, stats=pipeline.stats)
    pipeline = recipes.text() if name == "text-mix" else recipes.npy(mixed=name == "npy-mix")
    return soak(iter(pipeline), seconds=seconds, save=pipeline.state_dict, stats=pipeline.stats)


def report(name: str, samples: list[Sample]) -> None:
    kept = samples[_WARM:]
    counts = [s.done for s in kept]
    sizes = [s.rss for s in kept]
    unit = "restores" if name == "resume" else "micro-batches"
    mib = 2**20
    first, warm, last = samples[0], kept[0], samples[-1]
    print(
        f"{name:<9}{last.done:>10,} {unit}: RSS {first.rss / mib:.1f} -> {warm.rss / mib:.1f} "
        f"(warm) -> {last.rss / mib:.1f} MiB "
        f"(range {min(sizes) / mib:.1f}-{max(sizes) / mib:.1f}), "
        f"{slope(counts, sizes) / 1024:+.1f} KiB / 100k; objects {warm.objects:,} -> "
        f"{last.objects:,}, {slope(counts, [s.objects for s in kept]):+.1f} / 100k"
    )
    if warm.snapshot is not None and last.snapshot is not None:
        # not this script's own samples (their named tuples' code is "<string>")
        others = [
            tracemalloc.Filter(False, name) for name in (__file__, tracemalloc.__file__, "<string>")
        ]
        growth = last.snapshot.filter_traces(others).compare_to(
            warm.snapshot.filter_traces(others), "lineno"
        )
        for stat in growth[:6]:
            print(f"{'':<9}{stat.size_diff:+10,} B {stat.count_diff:+7,} blocks  {stat.traceback}")
    if last.workers and len(warm.workers) == len(last.workers):
        for number, (a, b) in enumerate(zip(warm.workers, last.workers, strict=True)):
            worker_slope = slope(counts, [s.workers[number] for s in kept]) / 1024
            print(
                f"{'':<9}worker {number}: RSS {a / mib:.1f} -> {b / mib:.1f} MiB, "
                f"{worker_slope:+.1f} KiB / 100k"
            )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--seconds", type=float, default=40, help="per configuration")
    p.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    p.add_argument("--trace", action="store_true", help="tracemalloc's top growing sites")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="zephon-soak-") as tmp:
        recipes = Recipes(pathlib.Path(tmp))
        for name in args.configs:
            if args.trace:
                tracemalloc.start()
            report(name, run(name, recipes, args.seconds))
            tracemalloc.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
