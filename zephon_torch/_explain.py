"""``Pipeline.explain()``: the compiled plan as text, data-affecting settings set apart."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zephon_torch._token_stage import doc_ops, prefetch_depth, read_datasets, token_stage
from zephon_torch._words import counted
from zephon_torch.errors import ConfigError, integer_setting
from zephon_torch.io._narrowing import NarrowedOrWhole
from zephon_torch.torch.dataset import workers_used

if TYPE_CHECKING:
    from zephon_torch._specs import PackSpec
    from zephon_torch.pipeline import Pipeline


def explain(pipeline: Pipeline, *, num_workers: int = 0) -> str:
    """The plan: recipe (in the fingerprint) and performance knobs (never change data)."""
    source, options, pack = pipeline._source, pipeline._options, pipeline._pack
    assert pack is not None
    world_size, rank = pipeline.topology
    lanes = pipeline.lanes
    _, _, parallelism, runner = token_stage(pipeline)
    lines = ["recipe (data-affecting: in the state fingerprint)"]
    lines.append(
        f"  canonical_replicas L={options.canonical_replicas}  seed={source.seed}  "
        f"mixing by {source.mixing}  exhaustion={source.exhaustion}"
        + (f"  passes={dict(zip(source.names, source.passes))}" if source.passes else "")
    )
    for dataset, weight in zip(source.datasets, source.weights):
        lines.append(
            f"  dataset {dataset.name!r}: {_share(weight)} target, {dataset.format}, "
            f"{counted(len(dataset.shards), 'shard')}, {counted(dataset.num_rows, 'row')}"
        )
    chain = ["fetch", *(_step(op.fingerprint()) for op in doc_ops(pipeline))]
    lines.append(f"  per document (in order): {' -> '.join(chain)}")
    serial = [_packing(pack)]
    serial += [f"stateful_filter({name})" for _, name in pipeline._stateful]
    if pipeline._shuffle_window:
        serial.append(f"shuffle(window={pipeline._shuffle_window})")
    serial.append(f"batch({pipeline._microbatch_size})")
    lines.append(f"  per lane (serial): {' -> '.join(serial)}")
    lines.append(
        "  bad rows: skipped and counted (stats()['skipped_documents']['malformed']; not in "
        "the fingerprint)"
        if options.bad_rows == "skip"
        else "  bad rows: raise (a DataError naming the row ends the run)"
    )
    lines.append("performance knobs (never change data)")
    lines.append(f"  rank {rank} of {world_size}: lanes {_span(lanes)} ({len(lanes)} per turn)")
    num_workers = integer_setting(num_workers, "`num_workers`")
    if num_workers < 0:
        raise ConfigError(f"`num_workers` must be >= 0, got {num_workers}")
    if num_workers:
        used = workers_used(num_lanes=len(lanes), num_workers=num_workers)
        lines.append(
            f"  DataLoader workers: {used} of {num_workers} used, {len(lanes) // used} lanes each"
        )
    for given, read in zip(pipeline._datasets, read_datasets(pipeline)):
        if read is not given:  # narrowed by the pipeline (`Dataset.reading`)
            what = [f"columns {list(read.columns or ())} only"] if given.columns is None else []
            added = [name for name in read.token_columns if name not in given.token_columns]
            what += [f"{name!r} as token ids" for name in added]
            skipping = isinstance(read, NarrowedOrWhole)
            whole = "; under skip, a shard lacking them is read whole" if skipping else ""
            lines.append(
                f"  dataset {read.name!r} reads {' and '.join(what)} (no map or filter reads "
                f"the rows{whole})"
            )
    where = "inline (the packer's thread)" if runner == "inline" else f"{runner} x {parallelism}"
    lines.append(
        f"  runner: {where}; read-ahead {options.read_ahead} chunks per reader (fewer for a "
        "source of under 25%)"
    )
    depth = prefetch_depth(pipeline)
    why = ""
    if options.prefetch == "auto":
        why = " (auto: pre-tokenized data)" if not depth else " (auto)"
    lines.append(
        f"  prefetch: {depth} micro-batches on a background thread{why}"
        if depth
        else f"  prefetch: none (micro-batches are made as the consumer asks){why}"
    )
    return "\n".join(lines)


_UNSHOWN = ("kind", "tokenizer", "prefix", "suffix", "encoding")  # digests, ids: not for reading


def _step(fingerprint: dict[str, Any]) -> str:
    """A per-document step by its kind and its settings (``tokenize(field='text',
    special_tokens='eos')``, ``map(name='clean')``)."""
    settings = [f"{key}={value!r}" for key, value in fingerprint.items() if key not in _UNSHOWN]
    return f"{fingerprint['kind']}({', '.join(settings)})"


def _span(lanes: list[int]) -> str:
    if lanes and lanes == list(range(lanes[0], lanes[-1] + 1)):
        return f"{lanes[0]}..{lanes[-1]}"
    return str(lanes)


def _share(weight: float) -> str:
    """A target share as a percentage: one decimal, or two significant digits below 0.1%
    (a weight of 1e-3 beside 3 showed as "0.0% target")."""
    return f"{weight:.1%}" if weight >= 0.001 else f"{weight * 100:.2g}%"


def _packing(pack: PackSpec) -> str:
    """The packing step as explain names it, with every setting in the fingerprint."""
    packing = [pack.algorithm, f"max_length={pack.max_length}"]
    if pack.algorithm != "wrap":
        packing.append(f"num_bins={pack.num_bins}")
    if pack.max_sequences_per_bin is not None:
        packing.append(f"max_sequences_per_bin={pack.max_sequences_per_bin}")
    if pack.long_documents != "split" and not pack.whole:
        packing.append(f"long_documents={pack.long_documents!r}")
    if pack.min_document_length:
        packing.append(f"min_document_length={pack.min_document_length}")
    if pack.whole:  # pack_sequences: whole documents, their payloads carried
        packing.append(f"payload_fields={list(pack.payload_fields)}")
    return f"mix+{'pack_sequences' if pack.whole else 'pack'}({', '.join(packing)})"
