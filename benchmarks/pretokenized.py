"""Pre-tokenized loading: the pipeline over stored token ids against a plain memmap read, one run.

The demo corpus (stdlib code and pydoc prose) is tokenized once with the demo tokenizer and
stored four ways under a temporary folder, as int32 (or `--dtype uint16`): (a) `.npy` token
files with `.offsets.npy` siblings, (b) MDS shards of an `ndarray:int32` (`uint16`) column
written by mosaicml-streaming's MDSWriter, (c) LitData token chunks written by
`litdata.optimize` with its `TokensLoader`, (d) Parquet with a `list<int32>` (`list<uint16>`)
column read with `token_columns=["input_ids"]`, once with pyarrow's
default writer settings (dictionary pages, snappy: "parquet") and once without dictionary
pages, zstd ("parquet_plain"). Each is read by
`Pipeline(...).pretokenized("input_ids").pack_flat(2048, "wrap").batch(8)` to the end (one pass,
`exhaustion="stop"`, shuffled as by default), touching every `batch.input_ids` ([8, 2048]
int64); `npy, stored order` is the `.npy` pipeline with `shuffle=False`, which reads the
documents in the baseline's order (its target line is printed apart). The baseline, in the
same run, reads the same `.npy` token files through `np.load(mmap_mode="r")` and copies them,
in order, into [8, 2048] int64 batches, one buffer written again (it stays in the cache): no
per-document work, no shuffling, no state; `memmap, fresh arrays` copies into a new array a
batch, as a loader must hand them out (the target is still judged against the baseline). A second
reference, the piece loop, copies the same documents one Python slice assignment per piece
(no mixing, no state); another, the shuffled copy, copies them in a random order with one
checked copy a batch, as the pipeline copies (what shuffling costs before any pipeline work); the
batch floor adds what any loader that hands out batch objects with their states pays on top
(a `Batch`, its layout, a state dict, the delivery counters), documents found by a search in
their running sums, as a packer working a chunk at a time would; a third, per Parquet
variant, is pyarrow's decode of the token column alone, the most any Parquet reader built on
it can deliver on one thread. Batches are copied by the
compiled `zephon_torch._native` where it is built; `npy, numpy only` is the `.npy` pipeline with
numpy in place of its loops, as where it is not. Token counts must
match the baseline's (no EOS is added), else exit code 2. Target: each format at least 0.5 of
the baseline (best of `--repeats`); a missed target still exits 0. Each repeat's own ratios
(every side over that repeat's memmap rate) are printed too, as their median and range: they
cancel drift in the machine's speed between repeats, which best over best does not.

    .venv/bin/python benchmarks/pretokenized.py [--repeats 3] [--copies 4] [--seq 2048]
        [--batch 8] [--doc-tokens 0] [--dtype int32] [--profile KIND]
"""

from __future__ import annotations

import argparse
import bisect
import cProfile
import hashlib
import importlib
import importlib.util
import io
import itertools
import json
import os
import pathlib
import pstats
import statistics
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from zephon_torch import Pipeline
from zephon_torch._corpus import cache_dir, demo_corpus, demo_tokenizer
from zephon_torch._stats import RunCounters
from zephon_torch.io import Dataset, _mds_bulk
from zephon_torch.ops import _copy, _wrap_blocks
from zephon_torch.ops._copy import fill
from zephon_torch.ops._row_layout import RowLayout
from zephon_torch.ops.batch import Batch
from zephon_torch.work import StaticMixtureWorkSource, _permutation

TARGET_RATIO = 0.5
_SHAPE = (8, 2048)  # [B, S]
_SHARDS = 8
_MDS_SHARD_BYTES = 1 << 24
_PARQUET_ROW_GROUP = 512
_MISMATCH_EXIT = 2
_KINDS = ("npy", "mds", "litdata", "parquet", "parquet_plain")
_INT32_TOP = 2**31 - 1
_NUMPY_ONLY = "npy, numpy only"
_STORED_ORDER = "npy, stored order"  # the npy pipeline unshuffled: the baseline's order
_STREAMING_PARENTS = ("streaming", "streaming.base", "streaming.base.format")
Tokens = npt.NDArray[np.int32]


# -- corpus ---------------------------------------------------------------------------------------


def tokenized_corpus() -> list[Tokens]:
    """Every demo document (code shards, then prose) as int32 token ids, no EOS.

    Tokenized once; cached under `cache_dir()/bench/` keyed by the tokenizer and corpus files.
    """
    code_dir, prose_dir = demo_corpus()
    tokenizer, tokenizer_path = demo_tokenizer()
    files = [p for folder in (code_dir, prose_dir) for p in sorted(folder.glob("part-*.jsonl"))]
    material = hashlib.sha256(tokenizer_path.read_bytes())
    for path in files:
        material.update(f"{path}\0{path.stat().st_size}\0{path.stat().st_mtime_ns}".encode())
    cached = cache_dir() / "bench" / f"pretokenized-{material.hexdigest()[:12]}.npz"
    if cached.is_file():
        with np.load(cached) as stored:
            tokens, offsets = stored["tokens"], stored["offsets"]
        return [tokens[a:b] for a, b in itertools.pairwise(offsets.tolist())]
    tokenizer.no_truncation()
    tokenizer.no_padding()
    texts: list[str] = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            texts.extend(json.loads(line)["text"] for line in f if line.strip())
    encodings = tokenizer.encode_batch_fast(texts, add_special_tokens=False)
    docs = [np.asarray(e.ids, dtype=np.int32) for e in encodings]
    docs = [d for d in docs if d.size]
    offsets = np.zeros(len(docs) + 1, dtype=np.int64)
    np.cumsum([d.size for d in docs], out=offsets[1:])
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_name(cached.name + ".tmp.npz")
    np.savez(tmp, tokens=np.concatenate(docs), offsets=offsets)
    tmp.replace(cached)
    return docs


def cut_documents(docs: list[Tokens], mean: int) -> list[Tokens]:
    """Each document cut into consecutive pieces of uniformly random lengths in
    ``[mean // 4, 7 * mean // 4]`` (the last piece shorter), seeded: the same tokens as
    documents of about ``mean`` tokens, as web text or chat corpora hold them."""
    rng = np.random.default_rng(0)
    out: list[Tokens] = []
    low, high = max(1, mean // 4), max(1, 7 * mean // 4)
    for doc in docs:
        start = 0
        while start < doc.size:
            end = start + int(rng.integers(low, high + 1))
            out.append(doc[start:end])
            start = end
    return out


def _split(docs: list[Tokens], parts: int) -> list[list[Tokens]]:
    size = -(-len(docs) // parts)
    return [docs[i : i + size] for i in range(0, len(docs), size)]


def write_npy(docs: list[Tokens], folder: pathlib.Path) -> None:
    folder.mkdir(parents=True)
    for number, part in enumerate(_split(docs, _SHARDS)):
        offsets = np.zeros(len(part) + 1, dtype=np.int64)
        np.cumsum([d.size for d in part], out=offsets[1:])
        np.save(folder / f"part-{number:03d}.npy", np.concatenate(part))
        np.save(folder / f"part-{number:03d}.offsets.npy", offsets)


def _mds_writer_class() -> Any:
    # `import streaming` imports torchvision, which may not import with this torch; load only the
    # writer module, with its parent packages stubbed out (the writer itself is unchanged).
    for name in _STREAMING_PARENTS:
        if name not in sys.modules:
            spec = importlib.util.find_spec(name)
            if spec is None or spec.submodule_search_locations is None:
                raise SystemExit("mosaicml-streaming is not installed")
            package = types.ModuleType(name)
            package.__path__ = list(spec.submodule_search_locations)
            package.__spec__ = spec
            sys.modules[name] = package
    return importlib.import_module("streaming.base.format.mds.writer").MDSWriter


def write_mds(docs: list[Tokens], folder: pathlib.Path) -> None:
    writer_class = _mds_writer_class()
    columns = {"input_ids": f"ndarray:{docs[0].dtype}"}
    with writer_class(out=str(folder), columns=columns, size_limit=_MDS_SHARD_BYTES) as writer:
        for doc in docs:
            writer.write({"input_ids": doc})


def write_litdata(docs: list[Tokens], folder: pathlib.Path) -> None:
    """`litdata.optimize` with its `TokensLoader` (one forked worker): token chunks, one item per
    document. optimize sets the process-wide start method; the previous one is restored."""
    import multiprocessing

    import litdata

    loader = importlib.import_module("litdata.streaming.item_loader").TokensLoader()
    previous = multiprocessing.get_start_method(allow_none=True)

    def item(index: int) -> Tokens:
        return docs[index]

    try:
        litdata.optimize(
            fn=item,
            inputs=list(range(len(docs))),
            output_dir=str(folder),
            chunk_bytes=_MDS_SHARD_BYTES,
            num_workers=1,
            start_method="fork",
            mode="overwrite",
            verbose=False,
            item_loader=loader,
        )
    finally:
        multiprocessing.set_start_method(previous, force=True)


def write_parquet(
    docs: list[Tokens], folder: pathlib.Path, *, shards: int = _SHARDS, **options: Any
) -> None:
    """pyarrow's defaults (dictionary pages, snappy), or `options` for `pq.write_table`."""
    folder.mkdir(parents=True)
    for number, part in enumerate(_split(docs, shards)):
        offsets = np.zeros(len(part) + 1, dtype=np.int32)
        np.cumsum([d.size for d in part], out=offsets[1:])
        column = pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.concatenate(part)))
        table = pa.table({"input_ids": column})
        pq.write_table(
            table,
            folder / f"part-{number:03d}.parquet",
            row_group_size=_PARQUET_ROW_GROUP,
            **options,
        )


# -- phases ---------------------------------------------------------------------------------------


def baseline(root: pathlib.Path, shape: tuple[int, int] = _SHAPE) -> int:
    """Memmap the `.npy` token files in order and copy them into [B, S] int64 batches."""
    batch = np.zeros(shape, dtype=np.int64)
    flat = batch.reshape(-1)
    filled = tokens = 0
    checksum = 0
    for path in sorted((root / "npy").glob("part-*[0-9].npy")):
        data = np.load(path, mmap_mode="r")
        start = 0
        while start < data.size:
            take = min(flat.size - filled, data.size - start)
            flat[filled : filled + take] = data[start : start + take]
            filled += take
            start += take
            if filled == flat.size:
                checksum += int(batch[0, 0])
                tokens += filled
                filled = 0
    if filled:
        flat[filled:] = 0
        checksum += int(batch[0, 0])
        tokens += filled
    return tokens


def npy_files(root: pathlib.Path) -> Iterator[tuple[npt.NDArray[Any], list[int]]]:
    """Each `.npy` token file, memory-mapped, with its documents' bounds (offsets file)."""
    for path in sorted((root / "npy").glob("part-*[0-9].npy")):
        bounds = np.load(path.with_name(path.name[: -len(".npy")] + ".offsets.npy")).tolist()
        yield np.load(path, mmap_mode="r"), bounds


def fresh_batches(root: pathlib.Path, shape: tuple[int, int] = _SHAPE) -> int:
    """The baseline's copy, in order, into a new [B, S] int64 array a batch (as any loader
    hands out batches its consumer may keep) rather than into one buffer written again; the
    files' last tokens, short of a batch, are left out (counted as read)."""
    size = shape[0] * shape[1]
    tokens = 0
    for data, _ in npy_files(root):
        for start in range(0, data.size - size + 1, size):
            batch = data[start : start + size].astype(np.int64).reshape(shape)
            tokens += batch.size
        tokens += data.size % size
    return tokens


def piece_loop(root: pathlib.Path, shape: tuple[int, int] = _SHAPE) -> int:
    """The floor of any per-document design: each document of the `.npy` files, in stored
    order, copied by one Python slice assignment per piece (cut at row ends) into [B, S]
    int64 batches; no mixing, no state, no objects."""
    batch = np.zeros(shape, dtype=np.int64)
    seq = shape[1]
    flat = batch.reshape(-1)
    filled = tokens = 0
    for data, bounds in npy_files(root):
        for first, end in itertools.pairwise(bounds):
            start = first
            while start < end:
                take = min(seq - filled % seq, end - start)
                flat[filled : filled + take] = data[start : start + take]
                filled += take
                start += take
                tokens += take
                if filled == flat.size:
                    filled = 0
    return tokens


def checked_copy(parts: list[npt.NDArray[Any]], batch: npt.NDArray[np.int64]) -> None:
    """`parts` copied into `batch` and its ids checked below 2**31 as the pipeline copies and
    checks them: the compiled copy where it is built (`zephon_torch._native`), else one
    `np.concatenate` and one maximum over the batch."""
    flat = batch.reshape(-1)
    if fill(parts, flat, _INT32_TOP) and np.maximum.reduce(flat.view(np.uint64)) > _INT32_TOP:
        raise SystemExit("an id out of range")


_COMPILED_USERS = (_copy, _permutation, _wrap_blocks, _mds_bulk)  # modules holding `_native`


def without_native(run: Callable[[], int]) -> Callable[[], int]:
    """`run` with numpy and Python in place of the compiled loops (the batch's copy and check,
    the shuffle's permutation, the block path's search, MDS places), as where
    `zephon_torch._native` is not built."""

    def wrapped() -> int:
        held = [module._native for module in _COMPILED_USERS]
        for module in _COMPILED_USERS:
            module._native = None
        try:
            return run()
        finally:
            for module, native in zip(_COMPILED_USERS, held, strict=True):
                module._native = native

    return wrapped


def shuffled_copy(root: pathlib.Path, shape: tuple[int, int] = _SHAPE) -> int:
    """What any shuffled pipeline pays before its own work: the documents of the `.npy` files,
    in a seeded random order, copied into [B, S] int64 batches one call a batch (documents cut
    at batch ends), their ids checked as the pipeline checks them (`checked_copy`); no mixing,
    no state, no objects."""
    docs: list[npt.NDArray[Any]] = []
    for mapped, bounds in npy_files(root):
        data = mapped.view(np.ndarray)
        docs += [data[a:b] for a, b in itertools.pairwise(bounds)]
    order = np.random.default_rng(0).permutation(len(docs)).tolist()
    size = shape[0] * shape[1]
    tokens = 0
    parts: list[npt.NDArray[Any]] = []
    room = size
    for index in order:
        doc = docs[index]
        while len(doc) >= room:
            parts.append(doc[:room])
            doc = doc[room:]
            batch = np.empty(shape, dtype=np.int64)
            checked_copy(parts, batch)
            tokens += size
            parts, room = [], size
        if len(doc):
            parts.append(doc)
            room -= len(doc)
    if parts:  # the last batch, padded
        parts.append(np.zeros(room, dtype=np.int64))
        np.concatenate(parts, out=np.empty(size, dtype=np.int64))
    return tokens + size - room


def batch_floor(root: pathlib.Path, shape: tuple[int, int] = _SHAPE) -> int:
    """The floor of any design that hands out a batch object with its state: the shuffled
    copy's documents and copies, found by a search in their running sums (no object or
    Python step per document, as a packer working a chunk at a time would), each batch a
    `Batch` with its `RowLayout` and a state dict of the pipeline's shape, counted by
    `RunCounters.delivered` as the pipeline counts what it delivers."""
    docs: list[npt.NDArray[Any]] = []
    for mapped, bounds in npy_files(root):
        data = mapped.view(np.ndarray)
        docs += [data[a:b] for a, b in itertools.pairwise(bounds)]
    order = np.random.default_rng(0).permutation(len(docs)).tolist()
    docs = [docs[i] for i in order]
    sizes = [len(d) for d in docs]
    ends = list(itertools.accumulate(sizes, initial=0))
    rows, seq = shape
    size, counters, total = rows * seq, RunCounters(), ends[-1]
    padding = np.zeros(size, dtype=np.int64)
    first = cut = turn = 0  # the next document, and how much of it earlier batches took
    while ends[first] + cut < total:
        stop = ends[first] + cut + size
        last = bisect.bisect_right(ends, stop, first) - 1  # documents first..last-1 end by stop
        if last == first:  # the batch lies inside one document
            parts, lengths = [docs[first][cut : cut + size]], [size]
            starts, cut = [cut == 0], cut + size
        else:
            parts = [docs[first][cut:], *docs[first + 1 : last]]
            lengths, starts = [sizes[first] - cut, *sizes[first + 1 : last]], [cut == 0]
            starts += [True] * (last - first - 1)
            cut = min(stop, total) - ends[last]
            if cut:
                parts.append(docs[last][:cut])
                lengths.append(cut)
                starts.append(True)
            first = last
        tokens = sum(lengths)
        if tokens < size:
            parts.append(padding[: size - tokens])
        ids = np.empty(shape, dtype=np.int64)
        checked_copy(parts, ids)
        turn += 1
        begun = first + (cut > 0)  # documents begun: a cut one's rest is the carry
        carry = [[0, 0, first, cut, sizes[first]]] if cut else []
        reader = {"pass": 0, "pos": begun, "filtered": 0}
        pack = {"readers": [reader], "delivered": [[ends[first] + cut, begun]], "active": [True]}
        pack |= {"carry": [carry], "skipped": {}, "packer": {}}
        layout = RowLayout.end_to_end(lengths, [0] * len(lengths), starts, width=seq, rows=rows)
        batch = Batch(ids, layout, ["npy"], 0, turn, 0, {"turn": turn, "done": False, "pack": pack})
        batch._num_tokens = tokens
        counters.delivered(batch, 0.0, None)
    return sum(counters.tokens_by_source.values())


def parquet_decode(root: pathlib.Path, kind: str) -> int:
    """Parquet's own floor: pyarrow decodes every row group's `input_ids` list column and hands
    over its flat values as numpy, on one thread; no batches, no documents."""
    tokens = 0
    for path in sorted((root / kind).glob("part-*.parquet")):
        file = pq.ParquetFile(path)
        for group in range(file.num_row_groups):
            column = file.read_row_group(group, columns=["input_ids"]).column(0)
            for chunk in column.chunks:
                tokens += chunk.values.to_numpy().size
    return tokens


def _dataset(root: pathlib.Path, kind: str) -> Dataset:
    if kind.startswith("parquet"):
        return Dataset.from_path(kind, root / kind, token_columns=["input_ids"])
    return Dataset.from_path(kind, root / kind)


def build_pipeline(dataset: Dataset, args: argparse.Namespace, *, shuffle: bool = True) -> Pipeline:
    source = StaticMixtureWorkSource([dataset], seed=0, exhaustion="stop", shuffle=shuffle)
    return (
        Pipeline(source)
        .options(canonical_replicas=args.lanes, prefetch=args.prefetch)
        .pretokenized("input_ids")
        .pack_flat(args.seq, "wrap")
        .batch(args.batch)
    )


def pipeline_tokens(pipeline: Pipeline, shape: tuple[int, int] = _SHAPE) -> int:
    """Iterate to the end, touching each batch's tensor; returns the real tokens delivered."""
    tokens = checksum = 0
    for batch in pipeline:
        ids = batch.input_ids
        if ids.shape != shape or ids.dtype != np.int64:
            raise SystemExit(f"unexpected batch {ids.shape} {ids.dtype}")
        checksum += int(ids[0, 0])
        tokens += batch.num_tokens
    return tokens


def timed(run: Callable[[], int]) -> tuple[int, float]:
    start = time.perf_counter()
    tokens = run()
    return tokens, time.perf_counter() - start


def profile(root: pathlib.Path, kind: str, args: argparse.Namespace, limit: int) -> None:
    """cProfile one pass over every thread the pipeline starts, merged, by own time.

    cProfile sees only the thread that enables it, so `threading.setprofile` hands each new
    thread its own profiler on its first event.
    """
    pipeline = build_pipeline(_dataset(root, kind), args)
    profilers: list[cProfile.Profile] = []

    def start(*_: Any) -> None:
        profiler = cProfile.Profile()
        profilers.append(profiler)
        profiler.enable()

    main_profiler = cProfile.Profile()
    threading.setprofile(start)
    main_profiler.enable()
    try:
        pipeline_tokens(pipeline, (args.batch, args.seq))
    finally:
        main_profiler.disable()
        threading.setprofile(None)  # type: ignore[arg-type]
    text = io.StringIO()
    stats = pstats.Stats(main_profiler, stream=text)
    for profiler in profilers:
        stats.add(profiler)
    stats.sort_stats("tottime").print_stats(limit)
    threads = 1 + len(profilers)
    print(f"\n-- cProfile of one {kind} pass, {threads} threads, top {limit} by own time --")
    print(text.getvalue().strip("\n"))


# -- driver ---------------------------------------------------------------------------------------


def _rate(tokens: int, seconds: float) -> str:
    return f"{tokens / seconds / 1e6:8.2f} M tok/s"


_KEPT = "settings.json"


def kept_settings(root: pathlib.Path, args: argparse.Namespace, *, write: bool) -> None:
    """Refuse stored formats under ``root`` written with other data settings (reused, they
    were measured under this run's labels: another dtype or document cut gives the same token
    count, so no check downstream sees it); with ``write``, record this run's settings."""
    settings = {"copies": args.copies, "doc_tokens": args.doc_tokens, "dtype": args.dtype}
    marker = root / _KEPT
    if write:
        marker.write_text(json.dumps(settings, sort_keys=True) + "\n")
        return
    if not any((root / kind).exists() for kind in _KINDS):
        return
    if not marker.is_file():
        raise SystemExit(
            f"{root} holds stored formats but no {_KEPT} naming their settings (written by an "
            "older script, or cut short): remove them or give another --keep folder"
        )
    kept = json.loads(marker.read_text())
    if kept != settings:
        differ = ", ".join(
            f"--{k.replace('_', '-')} {kept.get(k)} (asked {v})"
            for k, v in settings.items()
            if kept.get(k) != v
        )
        raise SystemExit(
            f"{root} holds stored formats written with {differ}: reuse them with those "
            "settings, or give another --keep folder"
        )


def run(root: pathlib.Path, args: argparse.Namespace) -> int:
    kept_settings(root, args, write=False)
    t0 = time.perf_counter()
    docs = tokenized_corpus() * args.copies
    if args.doc_tokens:
        docs = cut_documents(docs, args.doc_tokens)
    if args.dtype != "int32":
        docs = [d.astype(args.dtype) for d in docs]
    total = sum(d.size for d in docs)
    print(
        f"tokenized {len(docs):,} documents (mean {total / len(docs):,.0f} tokens), "
        f"{total:,} tokens in {time.perf_counter() - t0:.1f} s"
    )
    t0 = time.perf_counter()
    writers: dict[str, Callable[[list[Tokens], pathlib.Path], None]] = {
        "npy": write_npy,
        "mds": write_mds,
        "litdata": write_litdata,
        "parquet": write_parquet,
        "parquet_plain": lambda d, f: write_parquet(d, f, use_dictionary=False, compression="zstd"),
    }
    written = [kind for kind in _KINDS if not (root / kind).exists()]  # --keep: reuse the rest
    for kind in written:
        writers[kind](docs, root / kind)
    if written:
        kept_settings(root, args, write=True)
    print(
        f"wrote {', '.join(written) or 'nothing'} under {root} in {time.perf_counter() - t0:.1f} s"
    )
    del docs
    kinds = _KINDS
    shape = (args.batch, args.seq)
    best: dict[str, float] = {}
    paired: dict[str, list[float]] = {}  # each repeat's rate over that repeat's memmap rate
    for repeat in range(args.repeats):
        # Interleaved, so drift on the machine affects every side alike.
        line = []
        rates: dict[str, float] = {}
        # each side's callable is made before its timing starts (a pipeline is built then)
        sides: list[tuple[str, Callable[[], Callable[[], int]]]] = [
            ("memmap", lambda: partial(baseline, root, shape)),
            ("memmap, fresh arrays", lambda: partial(fresh_batches, root, shape)),
            ("piece loop", lambda: partial(piece_loop, root, shape)),
            ("shuffled copy", lambda: partial(shuffled_copy, root, shape)),
            ("batch floor", lambda: partial(batch_floor, root, shape)),
        ]
        for kind in ("parquet", "parquet_plain"):
            sides.append((f"{kind} decode", lambda k=kind: partial(parquet_decode, root, k)))
        for kind in kinds:
            built = partial(build_pipeline, _dataset(root, kind), args)
            sides.append((kind, lambda b=built: partial(pipeline_tokens, b(), shape)))
        built = partial(build_pipeline, _dataset(root, "npy"), args, shuffle=False)
        sides.append((_STORED_ORDER, lambda b=built: partial(pipeline_tokens, b(), shape)))
        if _copy._native is not None:  # the same pipeline where the compiled loops are not built
            built = partial(build_pipeline, _dataset(root, "npy"), args)
            sides.append(
                (_NUMPY_ONLY, lambda b=built: without_native(partial(pipeline_tokens, b(), shape)))
            )
        for name, make in sides:
            tokens, seconds = timed(make())
            if tokens != total:
                print(f"MISMATCH: {name} gave {tokens:,} tokens, expected {total:,}")
                return _MISMATCH_EXIT
            best[name] = max(best.get(name, 0.0), tokens / seconds)
            rates[name] = tokens / seconds
            line.append(f"{name} {_rate(tokens, seconds)}")
        print(f"repeat {repeat + 1}: " + ", ".join(line), flush=True)
        for name, rate in rates.items():
            paired.setdefault(name, []).append(rate / rates["memmap"])
    print(
        f"\nsettings: lanes {args.lanes}, batch [{args.batch}, {args.seq}] int64 wrap, "
        f"{args.dtype} ids stored, "
        f"{total:,} tokens, {os.cpu_count()} cores; best of {args.repeats}"
    )
    print(f"{'memmap baseline':<18}{_rate(int(best['memmap']), 1.0)}  (one buffer written again)")
    fresh = best["memmap, fresh arrays"]
    print(
        f"{'memmap, fresh':<18}{_rate(int(fresh), 1.0)}  ratio {fresh / best['memmap']:.3f}  "
        "(a new array a batch, as a loader hands them out)"
    )
    print(
        f"{'piece loop':<18}{_rate(int(best['piece loop']), 1.0)}  ratio "
        f"{best['piece loop'] / best['memmap']:.3f}  (one Python slice per piece, nothing else)"
    )
    print(
        f"{'shuffled copy':<18}{_rate(int(best['shuffled copy']), 1.0)}  ratio "
        f"{best['shuffled copy'] / best['memmap']:.3f}  (documents in a random order, one "
        "checked copy a batch: a shuffled pipeline's floor)"
    )
    print(
        f"{'batch floor':<18}{_rate(int(best['batch floor']), 1.0)}  ratio "
        f"{best['batch floor'] / best['memmap']:.3f}  (the shuffled copy, with a Batch, its "
        "layout and state, counted: the floor of a design that hands out batch objects)"
    )
    for kind in ("parquet", "parquet_plain"):
        floor = best[f"{kind} decode"]
        print(
            f"{kind + ' decode':<18}{_rate(int(floor), 1.0)}  ratio "
            f"{floor / best['memmap']:.3f}  (pyarrow's decode alone, one thread)"
        )
    for kind in kinds:
        ratio = best[kind] / best["memmap"]
        verdict = "met" if ratio >= TARGET_RATIO else "not met"
        floor = best.get(f"{kind} decode", best["piece loop"])
        what = "decode" if f"{kind} decode" in best else "piece loop"
        print(
            f"{kind + ' pipeline':<18}{_rate(int(best[kind]), 1.0)}  ratio {ratio:.3f}  "
            f"target {TARGET_RATIO}: {verdict}; {best[kind] / floor:.2f} of the {what}"
        )
    ratio = best[_STORED_ORDER] / best["memmap"]
    print(
        f"{_STORED_ORDER:<18}{_rate(int(best[_STORED_ORDER]), 1.0)}  ratio {ratio:.3f}  "
        f"target {TARGET_RATIO}: {'met' if ratio >= TARGET_RATIO else 'not met'} (the npy "
        "pipeline with shuffle=False, reading the documents in the baseline's order; the "
        "pipelines above shuffle, as by default)"
    )
    if _NUMPY_ONLY in best:
        ratio = best[_NUMPY_ONLY] / best["memmap"]
        print(
            f"{_NUMPY_ONLY:<18}{_rate(int(best[_NUMPY_ONLY]), 1.0)}  ratio {ratio:.3f}  "
            f"(the npy pipeline where zephon_torch._native is not built; "
            f"{best['npy'] / best[_NUMPY_ONLY]:.2f}x with it)"
        )
    else:
        print("zephon_torch._native is not built: numpy runs every side's loops")
    # Best over best pairs each side's luckiest repeat; on a machine whose speed drifts
    # between repeats, a repeat's own ratio is the steadier measure.
    print("paired ratios (each repeat's rate over the same repeat's memmap; median, range):")
    numpy_only = [_NUMPY_ONLY] if _NUMPY_ONLY in best else []
    for name in ["shuffled copy", "batch floor", *kinds, _STORED_ORDER, *numpy_only]:
        ratios = sorted(paired[name])
        print(f"  {name:<18}{statistics.median(ratios):.3f}  ({ratios[0]:.3f}-{ratios[-1]:.3f})")
    for kind in args.profile:
        profile(root, kind, args, args.profile_lines)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--lanes", type=int, default=1, help="canonical_replicas (L)")
    p.add_argument("--seq", type=int, default=_SHAPE[1], help="S, the row length")
    p.add_argument("--batch", type=int, default=_SHAPE[0], help="B, rows per micro-batch")
    p.add_argument("--copies", type=int, default=4, help="times the tokenized corpus is repeated")
    p.add_argument(
        "--doc-tokens",
        type=int,
        default=0,
        help="cut the documents into pieces of about this many tokens (0: as they are, "
        "about 4,900 on average)",
    )
    p.add_argument(
        "--profile",
        action="append",
        default=[],
        choices=_KINDS,
        help="cProfile one more pass of this format (repeatable)",
    )
    p.add_argument("--profile-lines", type=int, default=25)
    p.add_argument(
        "--dtype",
        choices=["int32", "uint16"],
        default="int32",
        help="how every format stores the ids (the demo vocabulary fits uint16)",
    )
    p.add_argument(
        "--prefetch",
        type=lambda v: v if v == "auto" else int(v),
        default="auto",
        help="micro-batches computed ahead: 'auto' (the default: none when read inline) or a "
        "number (0: none)",
    )
    p.add_argument(
        "--keep",
        help="write the stored formats here instead of a temporary folder, or reuse the ones "
        "already there (written with the same --copies, --doc-tokens and --dtype, else the run "
        "stops; for profiling: reused files are no verdict)",
    )
    args = p.parse_args(argv)
    if args.keep:
        root = pathlib.Path(args.keep)
        return run(root, args)
    with tempfile.TemporaryDirectory(prefix="zephon-pretok-") as tmp:
        return run(pathlib.Path(tmp), args)


if __name__ == "__main__":
    sys.exit(main())
