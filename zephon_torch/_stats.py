"""Where time and tokens go: counters a pipeline keeps while it runs, cheap enough to leave on.

Updated once per chunk of documents (operator timings), once per micro-batch (delivered
tokens, stalls) and never per token. ``Pipeline.stats()`` turns them into a report.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from zephon_torch._packed_rows import mixpack_of, pack_lanes
from zephon_torch._state import state_step
from zephon_torch._token_stage import read_datasets
from zephon_torch.ops._pack_skips import SKIP_REASONS
from zephon_torch.ops.batch import Batch

if TYPE_CHECKING:
    from zephon_torch.pipeline import Pipeline


@dataclass
class RunCounters:
    """Counters of one iteration of a pipeline."""

    started: float = field(default_factory=time.perf_counter)
    ended: float | None = None  # when the iteration ended (its stream ran out, or was closed)
    batches: int = 0
    rows: int = 0
    row_capacity: int = 0
    tokens_by_source: dict[str, int] = field(default_factory=dict)
    documents_by_source: dict[str, int] = field(default_factory=dict)
    consumer_waited: float = 0.0
    queue_samples: int = 0
    queue_total: int = 0
    count_documents: bool = False  # documents per source too (a mixture of document shares)

    def delivered(self, batch: Batch, waited: float, queued: int | None) -> None:
        """Record one micro-batch handed to the consumer after ``waited`` seconds (as
        ``received`` does, counted from the batch's layout without a dict a batch: this runs
        for every batch, and made 5% of a pre-tokenized pipeline's time)."""
        self._shaped(batch.input_ids.shape, waited)
        names, layout = batch.source_names, batch.layout
        if len(names) == 1:  # the usual case, without a list or a zip
            name = names[0]
            tokens = self.tokens_by_source
            tokens[name] = tokens.get(name, 0) + batch.num_tokens
            if self.count_documents:
                documents = self.documents_by_source
                documents[name] = documents.get(name, 0) + layout.documents_by_source(1)[0]
        else:
            _add(self.tokens_by_source, names, layout.tokens_by_source(len(names)))
            if self.count_documents:
                _add(self.documents_by_source, names, layout.documents_by_source(len(names)))
        if queued is not None:
            self.queue_samples += 1
            self.queue_total += queued

    def received(
        self,
        shape: tuple[int, ...],
        tokens: dict[str, int],
        documents: dict[str, int],
        waited: float,
    ) -> None:
        """Record one micro-batch of ``shape`` [rows, width] holding ``tokens`` (and beginning
        ``documents``) per source, which the consumer waited ``waited`` seconds for."""
        self._shaped(shape, waited)
        _add(self.tokens_by_source, tokens, tokens.values())
        _add(self.documents_by_source, documents, documents.values())

    def _shaped(self, shape: tuple[int, ...], waited: float) -> None:
        self.batches += 1
        rows, width = shape
        self.rows += rows
        self.row_capacity += rows * width
        self.consumer_waited += waited


def _add(counts: dict[str, int], names: Iterable[str], values: Iterable[int]) -> None:
    """Add ``values`` to ``counts`` under ``names``, in pairs."""
    for name, n in zip(names, values):
        counts[name] = counts.get(name, 0) + n


def report(
    counters: RunCounters,
    *,
    targets: dict[str, float],
    operators: dict[str, tuple[float, int]] | None,
    reader_waited: float | None,
    skipped: dict[str, int],
    state_bytes: int,
    cache: dict[str, Any] | None = None,
    mixing: str = "tokens",
) -> dict[str, Any]:
    """The stats report as plain data (see ``Pipeline.stats``); ``operators`` and
    ``reader_waited`` are None where they were measured in other processes."""
    ended = counters.ended if counters.ended is not None else time.perf_counter()
    elapsed = ended - counters.started
    tokens = sum(counters.tokens_by_source.values())
    # shares as the targets are: of tokens, or of documents for a mixture without estimation
    by_documents = mixing == "documents"
    shared = counters.documents_by_source if by_documents else counters.tokens_by_source
    total = sum(shared.values())
    return {
        "batches": counters.batches,
        "elapsed_s": elapsed,
        "tokens": tokens,
        "tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0,
        "tokens_by_source": dict(counters.tokens_by_source),
        "delivered_shares": {
            name: shared.get(name, 0) / total if total else 0.0 for name in targets
        },
        "shares_of": mixing,
        "target_shares": dict(targets),
        # what the model trains on, whatever the targets' unit: of documents, the shares above
        # read on target while the tokens' may be far off
        "token_shares": {
            name: counters.tokens_by_source.get(name, 0) / tokens if tokens else 0.0
            for name in targets
        },
        "padding_fraction": 1 - tokens / counters.row_capacity if counters.row_capacity else 0.0,
        "skipped_documents": dict(skipped),
        "operators": None if operators is None else _operators(operators),
        "stalls": {
            "consumer_waited_s": counters.consumer_waited,
            "packer_waited_for_documents_s": reader_waited,
        },
        "prefetch_queue_mean": (
            counters.queue_total / counters.queue_samples if counters.queue_samples else None
        ),
        "state_bytes": state_bytes,
        "cache": cache,
    }


def _operators(operators: dict[str, tuple[float, int]]) -> dict[str, dict[str, float]]:
    busy = sum(seconds for seconds, _ in operators.values()) or 1.0
    return {
        name: {
            "seconds": seconds,
            "documents": count,
            "documents_per_s": count / seconds if seconds > 0 else 0.0,
            "time_share": seconds / busy,
        }
        for name, (seconds, count) in operators.items()
    }


def pipeline_stats(pipeline: Pipeline) -> dict[str, Any]:
    """``Pipeline.stats()``: the counters of its live (or last) iteration, and its state."""
    runtime = pipeline._runtime
    source = pipeline._source
    return report(
        pipeline._counters,
        targets=dict(zip(source.names, source.weights)),
        operators=runtime.operator_seconds() if runtime is not None else {},
        reader_waited=runtime.reader_waited() if runtime is not None else 0.0,
        skipped=skipped_documents(pipeline._lane_states.values()),
        state_bytes=len(json.dumps(pipeline._state_dict())),
        cache=_cache_report(pipeline),
        mixing=source.mixing,
    )


def loader_stats(
    pipeline: Pipeline, counters: RunCounters, lanes: dict[str, Any]
) -> dict[str, Any]:
    """``DataLoader.stats()``: what the loop received, counted in the loop's process from
    each batch's record, with ``lanes`` the rank's delivered lane states. Operator timings
    and the packers' waits are the workers' (None here)."""
    source = pipeline._source
    state = pipeline._state_dict()
    state["lanes"], state["step"] = pack_lanes(lanes), state_step(lanes)
    return report(
        counters,
        targets=dict(zip(source.names, source.weights)),
        operators=None,
        reader_waited=None,
        skipped=skipped_documents(lanes.values()),
        state_bytes=len(json.dumps(state)),
        mixing=source.mixing,
    )


def skipped_documents(lane_states: Iterable[dict[str, Any] | None]) -> dict[str, int]:
    """Documents the length rules skipped, empty ones, and those the filters dropped, plain
    and stateful ("filtered"), summed over lane states."""
    skipped = dict.fromkeys((*SKIP_REASONS, "filtered"), 0)
    for state in lane_states:
        pack = mixpack_of(state)
        if pack is None:  # a lane not begun
            continue
        for key, n in pack["skipped"].items():
            skipped[key] += n
        for reader_state in pack.get("readers", []):
            plain = reader_state
            while isinstance(plain, dict) and "reader" in plain:  # beneath stateful filters
                skipped["filtered"] += plain.get("rejected", 0)
                plain = plain["reader"]
            if isinstance(plain, dict):
                skipped["filtered"] += plain.get("filtered", 0)
    return skipped


def _cache_report(pipeline: Pipeline) -> dict[str, Any] | None:
    """Shard-cache use of the remote datasets, summed (None when no dataset is remote)."""
    counters = [c for d in read_datasets(pipeline) if (c := d.cache_counters()) is not None]
    if not counters:
        return None
    total = {k: sum(c[k] for c in counters) for k in ("hits", "misses", "bytes_downloaded")}
    reads = total["hits"] + total["misses"]
    return {**total, "hit_rate": total["hits"] / reads if reads else 0.0}
