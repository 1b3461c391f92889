"""Check elastic determinism on a recipe: the same global batches for every configuration.

A recipe is a Python file defining ``pipeline() -> Pipeline`` (a complete recipe; topology is
set here). Ranks are simulated in one process: rank r of W is the recipe with
``options(world_size=W, rank=r)``, and the global batch of step t is the concatenation, in rank
order, of every rank's turn-t micro-batches. Each configuration's per-step global batches are
hashed (SHA-256 over input ids and positions); the verdict compares them all with the first.

The "standard loader" baseline is what most loaders do: a ``DistributedSampler`` over the same
documents for the live world size, each rank packing its own documents. Its batches depend on W.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DistributedSampler

from zephon_torch._state import merge_states
from zephon_torch.elastic import supported_world_sizes
from zephon_torch.errors import ConfigError
from zephon_torch.pipeline import Pipeline
from zephon_torch.torch.loader import DataLoader

Build = Callable[[], Pipeline]


@dataclass
class Run:
    """One configuration and the SHA-256 of each of its global batches."""

    name: str
    hashes: list[str]
    zephon: bool = True


def load_recipe(path: str | Path) -> Build:
    """The ``pipeline`` function of a recipe file."""
    spec = importlib.util.spec_from_file_location("zephon_recipe", str(path))
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot load recipe {str(path)!r}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    build = getattr(module, "pipeline", None)
    if not callable(build):
        raise ConfigError(f"recipe {str(path)!r} must define `pipeline() -> Pipeline`")
    return build  # type: ignore[no-any-return]


def _digest(parts: list[dict[str, torch.Tensor]]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part["input_ids"].numpy().tobytes())
        h.update(part["position_ids"].numpy().tobytes())
    return h.hexdigest()


def _rank_items(pipeline: Pipeline, num_workers: int) -> Iterator[dict[str, torch.Tensor]]:
    if num_workers:
        return iter(DataLoader(pipeline, num_workers=num_workers, multiprocessing_context="spawn"))
    return (b.to_training() for b in pipeline)


def zephon_run(
    build: Build,
    world_size: int,
    steps: int,
    *,
    num_workers: int = 0,
    start: dict[str, Any] | None = None,
    first_step: int = 0,
) -> list[str]:
    """Global-batch hashes of ``steps`` steps with ``world_size`` simulated ranks."""
    per_rank: list[list[list[dict[str, torch.Tensor]]]] = []
    for rank in range(world_size):
        pipeline = build().options(world_size=world_size, rank=rank)
        if start is not None:
            pipeline.load_state_dict(start)
        lanes = len(pipeline.lanes)
        items = _rank_items(pipeline, num_workers)
        turns = []
        for _ in range(first_step, steps):
            turn = [item for _, item in zip(range(lanes), items)]
            if len(turn) < lanes:
                break
            turns.append(turn)
        per_rank.append(turns)
    count = min(len(t) for t in per_rank)
    return [_digest([p for rank in per_rank for p in rank[t]]) for t in range(count)]


def fault_run(build: Build, before: int, after: int, fault_step: int, steps: int) -> list[str]:
    """Hashes of a run on ``before`` ranks that saves at ``fault_step`` and resumes on
    ``after`` ranks."""
    head = zephon_run(build, before, fault_step)
    states = []
    for rank in range(before):
        pipeline = build().options(world_size=before, rank=rank)
        lanes = len(pipeline.lanes)
        for i, _ in enumerate(pipeline):
            if i + 1 == fault_step * lanes:
                break
        states.append(pipeline.state_dict())
    merged = json.loads(json.dumps(merge_states(states)))
    return head + zephon_run(build, after, steps, start=merged, first_step=fault_step)


def standard_run(build: Build, world_size: int, steps: int) -> list[str]:
    """A DistributedSampler over the same documents, each rank packing its own (wrap)."""
    from zephon_torch._token_stage import doc_ops
    from zephon_torch.ops.fetch import FetchOp
    from zephon_torch.work.pointers import Pointer

    pipeline = build()
    source, pack = pipeline._source, pipeline._pack
    assert pack is not None and pipeline._microbatch_size is not None
    ops = doc_ops(pipeline)
    fetch = FetchOp(source.datasets)
    index = [
        (d, s, r)
        for d, ds in enumerate(source.datasets)
        for s, sh in enumerate(ds.shards)
        for r in range(sh.num_rows)
    ]
    lanes = pipeline._options.canonical_replicas
    per_rank_batches = lanes // world_size  # keep the global batch size of the recipe
    width, rows = pack.max_length, pipeline._microbatch_size
    ranks = []
    for rank in range(world_size):
        sampler: DistributedSampler[int] = DistributedSampler(
            index,  # type: ignore[arg-type]  # a list is a map-style dataset
            num_replicas=world_size,
            rank=rank,
            shuffle=True,
            seed=source.seed,
        )
        need = steps * per_rank_batches * rows * width
        stream: list[int] = []
        for i in sampler:
            dataset, shard, row = index[i]
            docs = fetch.fetch(dataset, [Pointer(0, 0, shard, row)])
            for op in ops:
                docs = op(docs)
            stream.extend(int(t) for d in docs for t in (d.tokens if d.tokens is not None else []))
            if len(stream) >= need:
                break
        tokens = np.asarray(stream[: need - need % width] or [0], dtype=np.int64)
        ranks.append(tokens)
    out: list[str] = []
    for t in range(steps):
        parts = []
        for tokens in ranks:
            for b in range(per_rank_batches):
                start = ((t * per_rank_batches) + b) * rows * width
                chunk = tokens[start : start + rows * width]
                if len(chunk) < rows * width:
                    return out
                ids = torch.from_numpy(chunk.reshape(rows, width).copy())
                parts.append(
                    {"input_ids": ids, "position_ids": torch.arange(width).repeat(rows, 1)}
                )
        out.append(_digest(parts))
    return out


def verify(
    build: Build,
    *,
    steps: int = 8,
    world_sizes: list[int] | None = None,
    workers: tuple[int, ...] = (0, 2),
    fault_step: int | None = None,
    standard: bool = True,
) -> list[Run]:
    """Every configuration's per-step global-batch hashes (see the module docstring)."""
    lanes = build()._options.canonical_replicas
    sizes = world_sizes or [w for w in supported_world_sizes(canonical_replicas=lanes) if w <= 64]
    runs = [Run(f"zephon W={w}", zephon_run(build, w, steps)) for w in sizes]
    for n in workers:
        if n:
            runs.append(
                Run(
                    f"zephon W={sizes[0]} workers={n}",
                    zephon_run(build, sizes[0], steps, num_workers=n),
                )
            )
    if fault_step is not None and len(sizes) > 1:
        runs.append(
            Run(
                f"zephon W={sizes[-1]} fault@{fault_step} -> W={sizes[0]}",
                fault_run(build, sizes[-1], sizes[0], fault_step, steps),
            )
        )
    if standard:
        runs += [Run(f"standard W={w}", standard_run(build, w, steps), zephon=False) for w in sizes]
    return runs


def table(runs: list[Run]) -> str:
    """Per-step hashes (first 10 hex digits) per configuration, and the verdicts."""
    reference = next(r for r in runs if r.zephon)
    steps = max(len(r.hashes) for r in runs)
    lines = ["step  " + "  ".join(f"{r.name[:28]:28s}" for r in runs)]
    for t in range(steps):
        cells = []
        for r in runs:
            h = r.hashes[t][:10] if t < len(r.hashes) else "-"
            mark = (
                " "
                if t < len(r.hashes)
                and t < len(reference.hashes)
                and r.hashes[t] == reference.hashes[t]
                else "*"
            )
            cells.append(f"{h + mark:28s}")
        lines.append(f"{t:4d}  " + "  ".join(cells))
    lines.append("")
    standard = [r for r in runs if not r.zephon]
    for r in runs:
        base = reference if r.zephon or not standard else standard[0]
        lines.append(f"{r.name}: {verdict(r, base)}")
    return "\n".join(lines)


def verdict(run: Run, reference: Run) -> str:
    """IDENTICAL, or where the run first diverges from the reference."""
    for t, (a, b) in enumerate(zip(run.hashes, reference.hashes)):
        if a != b:
            return f"DIVERGES from {reference.name} at step {t}"
    if len(run.hashes) != len(reference.hashes):
        return f"DIVERGES: {len(run.hashes)} steps vs {len(reference.hashes)}"
    return f"IDENTICAL to {reference.name} ({len(run.hashes)} steps)"
