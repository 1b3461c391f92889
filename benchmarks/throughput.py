"""Online throughput: the full pipeline against the tokenizer backend's own ceiling, one run.

Measures tokens/s of ``Pipeline`` (read JSONL, tokenize, mix, pack, batch) over one full pass of
a >= 50 MB corpus of real text, and in the same run the raw ``Tokenizer.encode_batch_fast``
throughput of the same tokenizer on the same documents and cores (DESIGN.md section 4: target
ratio >= 0.9). The baseline reads and parses the JSONL *before* its clock starts, so it pays no
I/O and no ``json`` decoding while the pipeline does: the comparison favours the baseline. Each
phase runs in its own subprocess so its peak RSS is its own (the baseline holds all texts in
memory). The pipeline's token count must equal the baseline's plus one EOS per document that
gives a token, and its skipped "empty" count the baseline's documents of no token (the pipeline
does not deliver a lone EOS), or the run stops with exit code 2; a missed target still exits 0
(a benchmark, not a test).

    .venv/bin/python benchmarks/throughput.py [--megabytes 60] [--lanes 8] [--parallelism N]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import sysconfig
import time
from typing import Any

# Must be set before `tokenizers` is imported, here and in every phase subprocess.
os.environ["TOKENIZERS_PARALLELISM"] = "true"

import tokenizers

from zephon_torch import Pipeline
from zephon_torch._corpus import (
    cache_dir,
    extra_text_documents,
    pydoc_prose_documents,
    stdlib_code_documents,
    train_bpe_tokenizer,
    write_jsonl_shards,
)
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource, TokenEstimation

TARGET_RATIO = 0.9
_RECIPE_VERSION = 1  # bump when the corpus recipe below changes
_MARKER = "COMPLETE.json"
_SHARDS = {"code": 16, "text": 4}
_TOKENIZER_SAMPLE_BYTES = 4_000_000
_RESULT_PREFIX = "RESULT "
_MB = 1_000_000
_TOKEN_MISMATCH_EXIT = 2


# -- corpus and tokenizer ------------------------------------------------------------------------


def _corpus_root(megabytes: int) -> pathlib.Path:
    """``cache_dir()/bench/<hash of recipe, Python build, site-packages>-<MB>mb``."""
    purelib = sysconfig.get_paths()["purelib"]
    material = f"{_RECIPE_VERSION}\0{sys.version}\0{sysconfig.get_paths()['stdlib']}\0{purelib}"
    key = hashlib.sha256(material.encode("utf-8")).hexdigest()[:12]
    return cache_dir() / "bench" / f"{key}-{megabytes}mb"


def build_corpus(megabytes: int) -> tuple[pathlib.Path, dict[str, Any]]:
    """Stdlib code, pydoc prose, then site-packages text up to ``megabytes``, as JSONL shards.

    ``code`` holds every ``.py`` file, ``text`` the pydoc topics and the ``.md``/``.rst``/
    ``.txt`` files. Built once; a marker written last tells a finished corpus from a half-built
    one.

    Returns:
        ``(root, summary)``; the datasets are ``root/code`` and ``root/text``.
    """
    root = _corpus_root(megabytes)
    marker = root / _MARKER
    if marker.is_file():
        return root, json.loads(marker.read_text())
    target = megabytes * _MB
    code = stdlib_code_documents()
    text = pydoc_prose_documents()
    have = sum(len(d["text"].encode("utf-8")) for d in code + text)
    purelib = pathlib.Path(sysconfig.get_paths()["purelib"])
    for doc in extra_text_documents([purelib], max(0, target - have)):
        (code if doc["id"].endswith(".py") else text).append(doc)
    summary: dict[str, Any] = {"recipe_version": _RECIPE_VERSION, "python": sys.version}
    for name, docs in (("code", code), ("text", text)):
        write_jsonl_shards(docs, root / name, num_shards=_SHARDS[name])
        summary[f"{name}_docs"] = len(docs)
        summary[f"{name}_bytes"] = sum(len(d["text"].encode("utf-8")) for d in docs)
    total = summary["code_bytes"] + summary["text_bytes"]
    if total < target:
        print(f"warning: only {total / _MB:.1f} MB of text found, asked for {megabytes} MB")
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    tmp.replace(marker)
    return root, summary


def _read_texts(directory: pathlib.Path) -> list[str]:
    """The ``text`` field of every row of ``directory/part-*.jsonl``, in shard and line order."""
    texts: list[str] = []
    for path in sorted(directory.glob("part-*.jsonl")):
        with open(path, encoding="utf-8") as f:
            texts.extend(json.loads(line)["text"] for line in f if line.strip())
    return texts


def corpus_tokenizer(root: pathlib.Path, vocab_size: int) -> pathlib.Path:
    """A byte-level BPE trained on every n-th document (~4 MB), cached beside the corpus."""
    path = root / f"tokenizer-{vocab_size}.json"
    if path.is_file():
        return path
    texts = _read_texts(root / "code") + _read_texts(root / "text")
    stride = max(1, sum(map(len, texts)) // _TOKENIZER_SAMPLE_BYTES)
    sample = texts[::stride]
    print(f"training a {vocab_size}-token BPE on {sum(map(len, sample)) / _MB:.1f} M chars ...")
    train_bpe_tokenizer(sample, vocab_size=vocab_size, path=path)
    return path


def load_tokenizer(path: str) -> tokenizers.Tokenizer:
    """The tokenizer as both phases use it: no truncation, no padding."""
    tok = tokenizers.Tokenizer.from_file(path)
    tok.no_truncation()
    tok.no_padding()
    return tok


def _max_rss_mb() -> float:
    """This process's peak resident set size so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


# -- phases (each runs in its own subprocess) ----------------------------------------------------


def phase_raw(args: argparse.Namespace) -> dict[str, Any]:
    """``encode_batch_fast`` over all documents in chunks; JSONL parsing is outside the clock."""
    root = pathlib.Path(args.corpus_root)
    tok = load_tokenizer(args.tokenizer)
    texts = _read_texts(root / "code") + _read_texts(root / "text")
    rss_loaded = _max_rss_mb()
    chunk = args.raw_chunk_docs
    tokens = empty = 0
    cpu0, t0 = _cpu_seconds(), time.perf_counter()
    for i in range(0, len(texts), chunk):
        encodings = tok.encode_batch_fast(texts[i : i + chunk], add_special_tokens=False)
        lengths = [len(e) for e in encodings]
        tokens += sum(lengths)
        empty += lengths.count(0)
    seconds = time.perf_counter() - t0
    return {
        "phase": "raw",
        # the documents that give a token: the pipeline skips the others (counted "empty")
        # rather than deliver a lone EOS
        "docs": len(texts) - empty,
        "empty_docs": empty,
        "tokens": tokens,
        "seconds": seconds,
        "cpu_seconds": _cpu_seconds() - cpu0,
        "tokens_per_s": tokens / seconds,
        "rss_after_load_mb": rss_loaded,
        "max_rss_mb": _max_rss_mb(),
    }


def build_pipeline(args: argparse.Namespace, tok: tokenizers.Tokenizer) -> Pipeline:
    """One full pass (``exhaustion="stop"``) over both datasets, mixed by their token shares."""
    root = pathlib.Path(args.corpus_root)
    summary = json.loads((root / _MARKER).read_text())
    # Shares proportional to size, so both sources stay in the mix for most of the pass.
    mixture = {"code": summary["code_bytes"], "text": summary["text_bytes"]}
    source = StaticMixtureWorkSource(
        [
            Dataset.from_path("code", str(root / "code")),
            Dataset.from_path("text", str(root / "text")),
        ],
        mixture,
        seed=0,
        token_estimation=TokenEstimation(),
        exhaustion="stop",
    )
    return (
        Pipeline(source)
        .options(canonical_replicas=args.lanes, read_ahead=args.read_ahead, prefetch=args.prefetch)
        .tokenize(
            tokenizer=tok, field="text", parallelism=args.parallelism, eos_token=args.eos_token
        )
        .pack_flat(args.max_length, "wrap")
        .batch(args.microbatch_size)
    )


def phase_pipeline(args: argparse.Namespace) -> dict[str, Any]:
    """Iterate a fresh pipeline to its end; count real tokens and documents."""
    tok = load_tokenizer(args.tokenizer)
    t_build = time.perf_counter()
    pipeline = build_pipeline(args, tok)
    build_seconds = time.perf_counter() - t_build
    rss_built = _max_rss_mb()
    tokens = docs = batches = 0
    first = 0.0
    cpu0, t0 = _cpu_seconds(), time.perf_counter()
    for batch in pipeline:
        if not batches:
            first = time.perf_counter() - t0
        batches += 1
        tokens += batch.num_tokens
        docs += sum(sum(row) for row in batch.starts_document)
    seconds = time.perf_counter() - t0
    return {
        "phase": "pipeline",
        "docs": docs,
        "empty_docs": pipeline.stats()["skipped_documents"].get("empty", 0),
        "tokens": tokens,
        "batches": batches,
        "seconds": seconds,
        "cpu_seconds": _cpu_seconds() - cpu0,
        "tokens_per_s": tokens / seconds,
        "build_seconds": build_seconds,
        "first_batch_seconds": first,
        "rss_after_build_mb": rss_built,
        "max_rss_mb": _max_rss_mb(),
    }


_PHASES = {"raw": phase_raw, "pipeline": phase_pipeline}


# -- driver --------------------------------------------------------------------------------------


def _machine_busy_seconds() -> float | None:
    """CPU seconds every process on the machine has spent busy so far (None off Linux)."""
    try:
        fields = pathlib.Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wait_for_quiet(limit_s: float, max_load: float) -> float | None:
    """Wait (at most ``limit_s``) for a one-second window with under ``max_load`` busy cores.

    On a shared machine other work takes cores in bursts; starting a phase in a quiet moment
    makes a clean measurement more likely. Returns the last load seen (None off Linux).
    """
    deadline = time.perf_counter() + limit_s
    while True:
        before, t0 = _machine_busy_seconds(), time.perf_counter()
        if before is None:
            return None
        time.sleep(1.0)
        after = _machine_busy_seconds()
        if after is None:
            return None
        load = (after - before) / (time.perf_counter() - t0)
        if load < max_load or time.perf_counter() >= deadline:
            return load


def run_phase(
    phase: str, args: argparse.Namespace, root: pathlib.Path, tok_path: str
) -> dict[str, Any]:
    """Run one phase in a fresh interpreter and return its JSON result line.

    Adds ``other_load``: the machine's busy CPU not spent by the phase, in cores, averaged over
    its run (needs /proc/stat). Well above zero means other work shared the cores.
    """
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        *("--phase", phase, "--corpus-root", str(root), "--tokenizer", tok_path),
        *("--lanes", str(args.lanes)),
        *("--max-length", str(args.max_length), "--microbatch-size", str(args.microbatch_size)),
        *("--raw-chunk-docs", str(args.raw_chunk_docs)),
    ]
    knobs = (
        ("--parallelism", args.parallelism),
        ("--read-ahead", args.read_ahead),
        ("--prefetch", args.prefetch),
    )
    for flag, value in knobs:
        if value is not None:
            cmd += [flag, str(value)]
    if args.eos_token is not None:
        cmd += ["--eos-token", args.eos_token]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "true"}
    wait_for_quiet(args.quiet_wait, args.max_other_load)
    busy0, own0, t0 = _machine_busy_seconds(), _children_cpu_seconds(), time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    busy1, own1, wall = _machine_busy_seconds(), _children_cpu_seconds(), time.perf_counter() - t0
    results = [ln for ln in done.stdout.splitlines() if ln.startswith(_RESULT_PREFIX)]
    if done.returncode != 0 or not results:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"phase {phase!r} failed with exit code {done.returncode}")
    result = dict(json.loads(results[-1][len(_RESULT_PREFIX) :]))
    if busy0 is not None and busy1 is not None:
        result["other_load"] = max(0.0, (busy1 - busy0) - (own1 - own0)) / wall
    return result


def _or_default(value: int | None) -> str:
    return "default" if value is None else str(value)


def _median(runs: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in runs))


def _best(runs: list[dict[str, Any]]) -> float:
    return float(max(r["tokens_per_s"] for r in runs))


def summarise(
    args: argparse.Namespace,
    summary: dict[str, Any],
    raw: list[dict[str, Any]],
    pipe: list[dict[str, Any]],
) -> None:
    """Print the table and the verdict.

    Ratios use, on each side, only the phases during which other processes used at most
    ``--max-other-load`` cores (all phases if a side has none, and the verdict says so).
    """

    def clean(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        ok = [r for r in runs if r.get("other_load", 0.0) <= args.max_other_load]
        return ok or runs

    raw_u, pipe_u = clean(raw), clean(pipe)
    conclusive = raw_u is not raw and pipe_u is not pipe
    ratio_best = _best(pipe_u) / _best(raw_u)
    ratio_median = _median(pipe_u, "tokens_per_s") / _median(raw_u, "tokens_per_s")
    pairs = [p["tokens_per_s"] / r["tokens_per_s"] for r, p in zip(raw, pipe)]
    cpu_ratio = _median(raw_u, "cpu_seconds") / _median(pipe_u, "cpu_seconds")
    code_mb, text_mb = summary["code_bytes"] / _MB, summary["text_bytes"] / _MB

    def speed(runs: list[dict[str, Any]]) -> str:
        return (
            f"{_best(runs) / 1e6:.3f} M tok/s best, {_median(runs, 'tokens_per_s') / 1e6:.3f} "
            f"median, {_median(runs, 'seconds'):.2f} s, cpu {_median(runs, 'cpu_seconds'):.1f} s"
        )

    rows = [
        ("corpus", f"{code_mb + text_mb:.1f} MB ({code_mb:.1f} code, {text_mb:.1f} text)"),
        ("documents", f"{raw[0]['docs']:,} (and {raw[0]['empty_docs']:,} empty, skipped)"),
        ("tokens raw / pipeline", f"{raw[0]['tokens']:,} / {pipe[0]['tokens']:,} (+1 EOS a doc)"),
        (
            "settings",
            f"lanes {args.lanes}, parallelism {args.parallelism or 'default'}, batch "
            f"{args.microbatch_size}x{args.max_length} wrap, "
            f"read_ahead {_or_default(args.read_ahead)}, prefetch {_or_default(args.prefetch)}, "
            f"{os.cpu_count()} cores",
        ),
        (
            "phases used",
            f"raw {len(raw_u)} of {len(raw)}, pipeline {len(pipe_u)} of {len(pipe)}"
            + ("" if conclusive else " (a side had no phase without other load: all used)"),
        ),
        ("raw encode_batch_fast", speed(raw_u)),
        ("pipeline", speed(pipe_u)),
        ("ratio pipeline/raw", f"{ratio_best:.3f} best/best, {ratio_median:.3f} median/median"),
        ("ratio per repeat", ", ".join(f"{x:.3f}" for x in pairs)),
        ("cpu ratio raw/pipeline", f"{cpu_ratio:.3f} (CPU seconds: the pipeline's overhead)"),
        (
            "time to first batch",
            f"{min(r['first_batch_seconds'] for r in pipe_u):.3f} s best, "
            f"{_median(pipe_u, 'first_batch_seconds'):.3f} s median "
            f"(+ {_median(pipe_u, 'build_seconds'):.3f} s building the pipeline before iter)",
        ),
        (
            "peak RSS raw",
            f"{max(r['max_rss_mb'] for r in raw):.0f} MB "
            f"({max(r['rss_after_load_mb'] for r in raw):.0f} MB after loading the texts)",
        ),
        (
            "peak RSS pipeline",
            f"{max(r['max_rss_mb'] for r in pipe):.0f} MB "
            f"({max(r['rss_after_build_mb'] for r in pipe):.0f} MB after building)",
        ),
    ]
    if all("other_load" in r for r in raw + pipe):
        loads = ", ".join(f"{r['other_load']:.2f}/{p['other_load']:.2f}" for r, p in zip(raw, pipe))
        rows.append(("other load raw/pipeline", f"{loads} cores per repeat"))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    verdict = "met" if ratio_best >= TARGET_RATIO else "not met"
    if not conclusive:
        verdict += (
            f", INCONCLUSIVE: other work used over {args.max_other_load} cores during every "
            "phase of one side"
        )
    print(f"target {TARGET_RATIO}: {verdict} (best/best ratio {ratio_best:.3f})")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; ``--phase`` and ``--corpus-root`` are for the phase subprocesses."""
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--megabytes", type=int, default=60, help="corpus size in MB of text (>= 50)")
    p.add_argument("--vocab-size", type=int, default=32768, help="BPE vocabulary when training")
    p.add_argument("--tokenizer", help="a tokenizer.json to use instead of training one")
    p.add_argument("--eos-token", help="EOS token name, if the tokenizer's is not guessed")
    p.add_argument("--lanes", type=int, default=8, help="canonical_replicas (L)")
    p.add_argument(
        "--parallelism", type=int, default=None, help="tokenize workers (default: the library's)"
    )
    p.add_argument("--read-ahead", type=int, help="chunks in flight per reader (library default)")
    p.add_argument("--prefetch", type=int, help="micro-batches prefetched (library default)")
    p.add_argument("--max-length", type=int, default=2048)
    p.add_argument("--microbatch-size", type=int, default=8)
    p.add_argument("--raw-chunk-docs", type=int, default=1024, help="docs per baseline call")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--max-other-load",
        type=float,
        default=0.25,
        help="cores other processes may use during a phase for it to count in the ratio",
    )
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=20.0,
        help="seconds to wait at most, before each phase, for the machine to go quiet",
    )
    p.add_argument("--phase", choices=sorted(_PHASES), help=argparse.SUPPRESS)
    p.add_argument("--corpus-root", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Build or reuse corpus and tokenizer, run the phases, print the table."""
    args = parse_args(argv)
    if args.phase is not None:
        print(_RESULT_PREFIX + json.dumps(_PHASES[args.phase](args)), flush=True)
        return 0
    if args.megabytes < 50:
        print(f"note: {args.megabytes} MB is below the 50 MB the target is defined on")
    t0 = time.perf_counter()
    root, summary = build_corpus(args.megabytes)
    tok_path = args.tokenizer or str(corpus_tokenizer(root, args.vocab_size))
    print(f"corpus {root} and tokenizer {tok_path} ready in {time.perf_counter() - t0:.1f} s")
    raw: list[dict[str, Any]] = []
    pipe: list[dict[str, Any]] = []
    for i in range(args.repeats):
        # Interleaved, so drift on the machine affects both sides alike.
        raw.append(run_phase("raw", args, root, tok_path))
        pipe.append(run_phase("pipeline", args, root, tok_path))
        print(
            f"repeat {i + 1}: raw {raw[-1]['tokens_per_s'] / 1e6:.3f} M tok/s, pipeline "
            f"{pipe[-1]['tokens_per_s'] / 1e6:.3f} M tok/s, first batch "
            f"{pipe[-1]['first_batch_seconds']:.3f} s, other load "
            f"{raw[-1].get('other_load', 0):.2f} / {pipe[-1].get('other_load', 0):.2f} cores",
            flush=True,
        )
        expected = raw[-1]["tokens"] + raw[-1]["docs"]
        got, want = pipe[-1], raw[-1]
        if (got["tokens"], got["docs"], got["empty_docs"]) != (
            expected,
            want["docs"],
            want["empty_docs"],
        ):
            print(
                f"MISMATCH: pipeline delivered {got['tokens']:,} tokens in {got['docs']:,} docs "
                f"and skipped {got['empty_docs']:,} empty ones, expected {expected:,} tokens (raw "
                f"+ 1 EOS for each document that gives a token) in {want['docs']:,} docs and "
                f"{want['empty_docs']:,} empty; the comparison is not valid"
            )
            return _TOKEN_MISMATCH_EXIT
    summarise(args, summary, raw, pipe)
    print(f"total wall time {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
