"""Packing: padding and cut documents per algorithm on a real corpus, and packing throughput
against the tokenizer's own, measured in one run.

The corpora come from ``demo_corpus()``, tokenized once by ``demo_tokenizer()`` (one EOS added
per document) before any clock starts, and are read from memory (``Dataset.from_dict``):

* ``mix``: stdlib code and pydoc prose, 50:50 by tokens, one pass (``exhaustion="stop"``: once
  the prose runs out the code fills the tail alone). Mostly long documents.
* ``prose``: pydoc prose alone, ``--prose-passes`` reshuffled passes. Mid-length documents,
  where the choice of bin matters more.
* ``paras``: the same prose split at blank lines, ``--paras-passes`` passes. Paragraph-sized
  documents (median 28 tokens): the stress case for per-document cost (documents/s).

Padding = 1 - real tokens / (rows holding data x max_length); the empty rows a finite stream
emits at its end are not counted. "split" is the share of documents spread over two or more
rows, "cuts/doc" the pieces that do not start their document (``starts_document`` False) per
document; "> L" is the share of documents longer than a row, which every algorithm must split.
Splits are counted in an untimed pass whose token ids are replaced by document numbers (packing
depends on lengths only, so the layout is the same and each segment names its document).

Throughput is ``.pretokenized("ids").pack_flat(L, algorithm).batch(8)`` over one full pass
(read, id checks, mix, pack, batch: all but the tokenizer), best of ``--repeats`` after that
warm-up pass. The baseline, in the same process: ``encode_batch_fast`` (all cores) on the same
texts, best of ``--repeats``. Packing "never limits the pipeline" when it runs at >= 10x the
tokenizer's tokens/s, i.e. adds at most 10% CPU on top of tokenizing. Every pass must deliver
every token exactly once, or the run stops with exit code 2; a missed target still exits 0.

    .venv/bin/python benchmarks/packing.py [--quick] [--lengths 2048 8192] [--bins 8 64]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import cast

# Must be set before `tokenizers` is imported: the baseline uses every core.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

import numpy as np
import numpy.typing as npt
import tokenizers

from zephon_torch import Pipeline
from zephon_torch._corpus import END_OF_TEXT, demo_corpus, demo_tokenizer
from zephon_torch.io import Dataset
from zephon_torch.ops.packers import ALGORITHMS, Algorithm
from zephon_torch.work import StaticMixtureWorkSource, TokenEstimation

TARGET_RATIO = 10.0
MICROBATCH_SIZE = 8
SHARD_SIZE = 64
_CORPORA = ("mix", "prose", "paras")
_MISMATCH_EXIT = 2
_QUICK_CODE_DOCS = 300
_QUICK_PROSE_PASSES = 5
_QUICK_PARAS_PASSES = 2

Ids = list[npt.NDArray[np.int32]]


# -- corpus and baseline ----------------------------------------------------------------------


def read_texts(directory: pathlib.Path) -> list[str]:
    """The ``text`` field of every row of ``directory/part-*.jsonl``, in shard and line order."""
    texts: list[str] = []
    for path in sorted(directory.glob("part-*.jsonl")):
        with open(path, encoding="utf-8") as f:
            texts.extend(json.loads(line)["text"] for line in f if line.strip())
    return texts


def every_nth(items: list[str], limit: int | None) -> list[str]:
    """At most ``limit`` items spread evenly over ``items`` (all when None)."""
    if limit is None or limit >= len(items):
        return items
    step = len(items) / limit
    return [items[int(i * step)] for i in range(limit)]


@dataclass
class Timing:
    """Wall and CPU seconds (every thread of this process) of repeated runs."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    def add(self, wall: float, cpu: float) -> None:
        self.wall.append(wall)
        self.cpu.append(cpu)

    @property
    def best_wall(self) -> float:
        return min(self.wall)

    @property
    def best_cpu(self) -> float:
        return min(self.cpu)

    @property
    def spread(self) -> float:
        """Slowest over fastest wall time, minus one: how noisy the repeats were."""
        return max(self.wall) / min(self.wall) - 1


@dataclass
class Corpus:
    """One corpus: per dataset its token ids (EOS included), mixture and passes."""

    name: str
    ids: dict[str, Ids]
    mixture: dict[str, float]
    passes: int
    baseline: Timing

    @property
    def tokenizer_tokens_per_s(self) -> float:
        """Tokens (EOS included, as packing counts them) per wall second of the baseline."""
        return self.tokens / self.baseline.best_wall

    @property
    def tokenizer_tokens_per_cpu_s(self) -> float:
        """Tokens per CPU second (all threads) of the baseline."""
        return self.tokens / self.baseline.best_cpu

    @property
    def documents(self) -> int:
        return self.passes * sum(len(v) for v in self.ids.values())

    @property
    def tokens(self) -> int:
        return self.passes * sum(len(a) for v in self.ids.values() for a in v)

    def lengths(self) -> npt.NDArray[np.int64]:
        return np.array([len(a) for v in self.ids.values() for a in v], dtype=np.int64)


def tokenize_timed(
    tok: tokenizers.Tokenizer, texts: Sequence[str], *, chunk_docs: int, repeats: int
) -> tuple[list[list[int]], Timing]:
    """``encode_batch_fast`` over ``texts`` in chunks: the ids and the timing of each run."""
    timing = Timing()
    ids: list[list[int]] = []
    for _ in range(repeats):
        ids = []
        wall, cpu = time.perf_counter(), time.process_time()
        for i in range(0, len(texts), chunk_docs):
            encodings = tok.encode_batch_fast(texts[i : i + chunk_docs], add_special_tokens=False)
            ids.extend(e.ids for e in encodings)
        timing.add(time.perf_counter() - wall, time.process_time() - cpu)
    return ids, timing


def build_corpus(
    name: str,
    texts: dict[str, list[str]],
    mixture: dict[str, float],
    passes: int,
    tok: tokenizers.Tokenizer,
    args: argparse.Namespace,
) -> Corpus:
    """Tokenize each dataset once (the baseline clock) and append EOS outside the clock.

    The baseline encodes every document as often as the pipeline delivers it (``passes``).
    """
    eos = tok.token_to_id(END_OF_TEXT)
    if eos is None:
        raise SystemExit(f"the tokenizer has no {END_OF_TEXT!r} token")
    all_texts = [t for v in texts.values() for t in v]
    encoded, timing = tokenize_timed(
        tok, all_texts * passes, chunk_docs=args.chunk_docs, repeats=args.repeats
    )
    ids: dict[str, Ids] = {}
    start = 0
    for dataset, items in texts.items():
        ids[dataset] = [
            np.append(np.asarray(e, dtype=np.int32), np.int32(eos))
            for e in encoded[start : start + len(items)]
        ]
        start += len(items)
    return Corpus(
        name=name,
        ids=ids,
        mixture=mixture,
        passes=passes,
        baseline=timing,
    )


# -- packing passes ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """One packing setting; ``num_bins`` is None for ``wrap``."""

    max_length: int
    algorithm: Algorithm
    num_bins: int | None


def make_pipeline(corpus: Corpus, config: Config, ids: dict[str, Ids]) -> Pipeline:
    """One lane, one full pass over ``ids`` (``corpus.passes`` passes of each dataset)."""
    datasets = [
        Dataset.from_dict(name, {"ids": arrays}, shard_size=SHARD_SIZE)
        for name, arrays in ids.items()
    ]
    source = StaticMixtureWorkSource(
        datasets,
        corpus.mixture,
        seed=0,
        token_estimation=TokenEstimation(),
        exhaustion="stop",
        passes=corpus.passes,
    )
    return (
        Pipeline(source)
        .options(canonical_replicas=1)
        .pretokenized("ids")
        .pack_flat(config.max_length, config.algorithm, num_bins=config.num_bins)
        .batch(MICROBATCH_SIZE)
    )


@dataclass
class Layout:
    """What one pass delivered, counted from the batches."""

    tokens: int = 0
    rows: int = 0
    documents: int = 0
    cuts: int = 0
    split: int = 0


def count_layout(pipeline: Pipeline, doc_lengths: npt.NDArray[np.int64]) -> Layout:
    """Rows, tokens, documents, cuts and split documents of one pass over a corpus whose token
    ids are document numbers: a document is split when its first piece is not all of it."""
    out = Layout()
    for batch in pipeline:
        for r, (lengths, starts) in enumerate(zip(batch.lengths, batch.starts_document)):
            if not lengths:
                continue
            out.rows += 1
            offset = 0
            for length, start in zip(lengths, starts):
                out.tokens += length
                if not start:
                    out.cuts += 1
                else:
                    out.documents += 1
                    doc = int(batch.input_ids[r, offset])
                    out.split += length < doc_lengths[doc]
                offset += length
    return out


def time_pass(pipeline: Pipeline, timing: Timing) -> int:
    """Iterate one full pass, add its wall and CPU seconds to ``timing``; the real tokens."""
    tokens = 0
    wall, cpu = time.perf_counter(), time.process_time()
    for batch in pipeline:
        tokens += batch.num_tokens
    timing.add(time.perf_counter() - wall, time.process_time() - cpu)
    return tokens


@dataclass
class Result:
    """One setting measured on one corpus."""

    corpus: Corpus
    config: Config
    layout: Layout
    timing: Timing

    @property
    def padding(self) -> float:
        return 1 - self.layout.tokens / (self.layout.rows * self.config.max_length)

    @property
    def tokens_per_s(self) -> float:
        return self.layout.tokens / self.timing.best_wall

    @property
    def docs_per_s(self) -> float:
        return self.layout.documents / self.timing.best_wall

    @property
    def ratio(self) -> float:
        """Packing over tokenizer, tokens per wall second."""
        return self.tokens_per_s / self.corpus.tokenizer_tokens_per_s

    @property
    def cpu_ratio(self) -> float:
        """Packing over tokenizer, tokens per CPU second: insensitive to other load."""
        per_cpu_s = self.layout.tokens / self.timing.best_cpu
        return per_cpu_s / self.corpus.tokenizer_tokens_per_cpu_s


def numbered(ids: dict[str, Ids]) -> tuple[dict[str, Ids], npt.NDArray[np.int64]]:
    """The same lengths, every token replaced by its document's number; and the lengths."""
    out: dict[str, Ids] = {}
    lengths: list[int] = []
    for name, arrays in ids.items():
        out[name] = []
        for a in arrays:
            out[name].append(np.full(len(a), len(lengths), dtype=np.int32))
            lengths.append(len(a))
    return out, np.array(lengths, dtype=np.int64)


class TokenMismatch(Exception):
    """A pass did not deliver every token of the corpus exactly once."""


def measure(corpus: Corpus, config: Config, repeats: int) -> Result:
    """An untimed counting pass (also the warm-up), then ``repeats`` timed passes."""
    marked, doc_lengths = numbered(corpus.ids)
    layout = count_layout(make_pipeline(corpus, config, marked), doc_lengths)
    timing = Timing()
    for _ in range(repeats):
        tokens = time_pass(make_pipeline(corpus, config, corpus.ids), timing)
        if tokens != corpus.tokens:
            raise TokenMismatch(f"{config}: timed pass delivered {tokens:,} tokens")
    if layout.tokens != corpus.tokens or layout.documents != corpus.documents:
        raise TokenMismatch(
            f"{config}: counting pass delivered {layout.tokens:,} tokens in "
            f"{layout.documents:,} documents"
        )
    return Result(corpus, config, layout, timing)


# -- report -----------------------------------------------------------------------------------


def machine_busy_seconds() -> float | None:
    """CPU seconds every process on the machine has spent busy so far (None off Linux)."""
    try:
        fields = pathlib.Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def describe(corpus: Corpus, lengths: Sequence[int]) -> str:
    """The corpus, its document lengths and its tokenizer baseline."""
    sizes = corpus.lengths()
    per = ", ".join(
        f"{name} {len(v):,} docs {sum(len(a) for a in v):,} tok" for name, v in corpus.ids.items()
    )
    p50, p90, p99 = np.percentile(sizes, [50, 90, 99])
    longer = ", ".join(f"> {n}: {100 * np.mean(sizes > n):.1f}%" for n in lengths)
    b = corpus.baseline
    return (
        f"{corpus.name}: {per}; x{corpus.passes} pass(es) = {corpus.documents:,} docs, "
        f"{corpus.tokens:,} tokens with EOS\n"
        f"  doc tokens p50 {p50:.0f}, p90 {p90:.0f}, p99 {p99:.0f}, max {sizes.max():,}; {longer}\n"
        f"  tokenizer baseline (encode_batch_fast, {os.cpu_count()} cores): "
        f"{corpus.tokenizer_tokens_per_s / 1e6:.3f} M tok/s, "
        f"{corpus.documents / b.best_wall:,.0f} docs/s, "
        f"{corpus.tokenizer_tokens_per_cpu_s / 1e6:.3f} M tok per CPU-s "
        f"(best of {len(b.wall)}, spread {100 * b.spread:.0f}%)"
    )


_HEADER = (
    f"{'corpus':<6} {'L':>5} {'algorithm':<13} {'bins':>4} {'rows':>6} {'padding':>8} "
    f"{'split':>6} {'> L':>6} {'cuts/doc':>8} {'docs/s':>8} {'M tok/s':>8} {'x tok':>6} "
    f"{'x cpu':>6} {'spread':>6}"
)


def row(result: Result) -> str:
    """One table line."""
    c, lay = result.config, result.layout
    longer = float(np.mean(result.corpus.lengths() > c.max_length))
    return (
        f"{result.corpus.name:<6} {c.max_length:>5} {c.algorithm:<13} "
        f"{'-' if c.num_bins is None else c.num_bins:>4} {lay.rows:>6} "
        f"{100 * result.padding:>7.3f}% {100 * lay.split / lay.documents:>5.1f}% "
        f"{100 * longer:>5.1f}% {lay.cuts / lay.documents:>8.2f} {result.docs_per_s:>8,.0f} "
        f"{result.tokens_per_s / 1e6:>8.2f} {result.ratio:>6.1f} {result.cpu_ratio:>6.1f} "
        f"{100 * result.timing.spread:>5.0f}%"
    )


def verdict(results: Sequence[Result], ratio: Callable[[Result], float], clock: str) -> bool:
    """Print whether every setting packs >= ``TARGET_RATIO`` x the tokenizer's rate."""
    worst = min(results, key=ratio)
    met = ratio(worst) >= TARGET_RATIO
    c = worst.config
    print(
        f"  by {clock}: {'MET' if met else 'NOT MET'}; slowest {worst.corpus.name} "
        f"{c.algorithm} L={c.max_length} bins={c.num_bins or '-'} at {ratio(worst):.1f}x, "
        f"median over settings {statistics.median(ratio(r) for r in results):.1f}x"
    )
    return met


# -- driver -----------------------------------------------------------------------------------


def configs(args: argparse.Namespace) -> list[Config]:
    """Every (length, algorithm, bins) setting asked for; ``wrap`` has no bins."""
    out: list[Config] = []
    for length in args.lengths:
        for algorithm in args.algorithms:
            bins: list[int | None] = [None] if algorithm == "wrap" else list(args.bins)
            out.extend(Config(length, cast(Algorithm, algorithm), n) for n in bins)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0] if __doc__ else None)
    p.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192])
    p.add_argument("--algorithms", nargs="+", choices=ALGORITHMS, default=list(ALGORITHMS))
    p.add_argument("--bins", type=int, nargs="+", default=[8, 64], help="bin packers' num_bins")
    p.add_argument("--corpora", nargs="+", choices=_CORPORA, default=list(_CORPORA))
    p.add_argument("--repeats", type=int, help="timed passes (and baseline runs); default 3")
    p.add_argument("--max-code-docs", type=int, default=None, help="code docs, spread evenly")
    p.add_argument("--prose-passes", type=int, help="default 30")
    p.add_argument("--paras-passes", type=int, help="default 10")
    p.add_argument("--chunk-docs", type=int, default=256, help="docs per baseline call")
    p.add_argument(
        "--quick",
        action="store_true",
        help=f"{_QUICK_CODE_DOCS} code docs, {_QUICK_PROSE_PASSES} prose and "
        f"{_QUICK_PARAS_PASSES} paras passes, 1 repeat, where those flags are not given",
    )
    args = p.parse_args(argv)
    # a flag given beside --quick is kept: --quick only changes the defaults
    defaults = {"max_code_docs": None, "prose_passes": 30, "paras_passes": 10, "repeats": 3}
    if args.quick:
        defaults = {
            "max_code_docs": _QUICK_CODE_DOCS,
            "prose_passes": _QUICK_PROSE_PASSES,
            "paras_passes": _QUICK_PARAS_PASSES,
            "repeats": 1,
        }
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def main(argv: list[str] | None = None) -> int:
    """Build the corpora, measure every setting, print the table and the verdict."""
    args = parse_args(argv)
    t0, cpu0, busy0 = time.perf_counter(), time.process_time(), machine_busy_seconds()
    code_dir, prose_dir = demo_corpus()
    tok, tok_path = demo_tokenizer()
    code = every_nth(read_texts(code_dir), args.max_code_docs)
    prose = read_texts(prose_dir)
    paras = [p for text in prose for p in text.split("\n\n") if p.strip()]
    code_mb = sum(len(t.encode("utf-8")) for t in code) / 1e6
    prose_mb = sum(len(t.encode("utf-8")) for t in prose) / 1e6
    print(
        f"corpus: {len(code):,} code docs ({code_mb:.1f} MB), "
        f"{len(prose)} prose docs ({prose_mb:.2f} MB) = {len(paras):,} paragraphs"
    )
    print(f"tokenizer: {tok_path} (vocab {tok.get_vocab_size():,})")
    builders: dict[str, Callable[[], Corpus]] = {
        "mix": lambda: build_corpus(
            "mix", {"code": code, "prose": prose}, {"code": 0.5, "prose": 0.5}, 1, tok, args
        ),
        "prose": lambda: build_corpus(
            "prose", {"prose": prose}, {"prose": 1.0}, args.prose_passes, tok, args
        ),
        "paras": lambda: build_corpus(
            "paras", {"paras": paras}, {"paras": 1.0}, args.paras_passes, tok, args
        ),
    }
    results: list[Result] = []
    for name in args.corpora:
        corpus = builders[name]()
        print(describe(corpus, args.lengths), flush=True)
        for config in configs(args):
            try:
                results.append(measure(corpus, config, args.repeats))
            except TokenMismatch as exc:
                print(
                    f"MISMATCH: {exc}; expected {corpus.tokens:,} tokens in "
                    f"{corpus.documents:,} documents"
                )
                return _MISMATCH_EXIT
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    busy1 = machine_busy_seconds()
    print()
    print(
        f"micro-batch {MICROBATCH_SIZE} rows, one lane. docs/s, M tok/s: best of {args.repeats} "
        "full passes by wall time. x tok: packing tok/s over the tokenizer's (wall; the "
        "tokenizer uses every core, packing about one); x cpu: the same per CPU-second. "
        "spread: slowest/fastest pass - 1."
    )
    print(_HEADER)
    previous = None
    for result in results:
        if previous is not None and (result.corpus.name, result.config.max_length) != previous:
            print()
        previous = (result.corpus.name, result.config.max_length)
        print(row(result))
    print()
    print(
        f"packing never limits the pipeline (>= {TARGET_RATIO:g}x the tokenizer in every setting):"
    )
    by_wall = verdict(results, lambda r: r.ratio, "wall time")
    by_cpu = verdict(results, lambda r: r.cpu_ratio, "CPU time")
    print(f"  overall: {'MET' if by_wall and by_cpu else 'NOT MET'}")
    if busy0 is not None and busy1 is not None:
        other = max(0.0, busy1 - busy0 - cpu) / wall
        note = " (wall-clock ratios are noisy; trust x cpu)" if other > 0.25 else ""
        print(f"other processes kept {other:.2f} of {os.cpu_count()} cores busy on average{note}")
    print(f"total wall time {wall:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
