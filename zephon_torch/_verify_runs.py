"""How `verify` runs each configuration of a recipe: simulated ranks of zephon_torch (from the
start, or resumed from a state saved on another world size), and the standard loader baseline
(a ``DistributedSampler`` over the same documents, each rank packing its own). Each gives the
SHA-256 of every global batch (input ids and positions), or the batches themselves for
``--plot``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DistributedSampler

from zephon_torch._state import merge_states
from zephon_torch.pipeline import Pipeline
from zephon_torch.torch.loader import DataLoader

Build = Callable[[], Pipeline]


@contextlib.contextmanager
def ranks_simulated() -> Iterator[None]:
    """RANK and WORLD_SIZE left out of the environment while ranks are simulated in this
    process (and the workers it starts): a shell that torchrun, SLURM or a pod opened sets
    them, and each simulated rank's options would be checked against them."""
    saved = {name: os.environ.pop(name) for name in ("RANK", "WORLD_SIZE") if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


@contextlib.contextmanager
def as_rank(rank: int, world_size: int) -> Iterator[None]:
    """RANK and WORLD_SIZE set as a real job's rank ``rank`` would see them, while that
    simulated rank is built and run: a recipe whose map reads its rank from the environment
    then makes each simulated rank's data as the real rank would (and verify sees it)."""
    saved = {name: os.environ.get(name) for name in ("RANK", "WORLD_SIZE")}
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size))
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def digest(parts: list[dict[str, torch.Tensor]]) -> str:
    """The SHA-256 of a global batch: its ranks' input ids, positions and labels (the loss
    masks of chat data among them; the standard loader's have none), in rank order."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part["input_ids"].numpy().tobytes())
        h.update(part["position_ids"].numpy().tobytes())
        if "labels" in part:
            h.update(part["labels"].numpy().tobytes())
    return h.hexdigest()


class StepHashes(list[str]):
    """Global-batch hashes, each step's micro-batch hashes beside them (``parts``)."""

    def __init__(self, batches: list[list[dict[str, torch.Tensor]]]) -> None:
        super().__init__(digest(parts) for parts in batches)
        self.parts = [[digest([part]) for part in parts] for parts in batches]

    @classmethod
    def joined(cls, head: StepHashes, tail: StepHashes) -> StepHashes:
        """``head``'s steps, then ``tail``'s."""
        both = cls([])
        both.extend([*head, *tail])
        both.parts = head.parts + tail.parts
        return both


def _rank_items(pipeline: Pipeline, num_workers: int) -> Iterator[dict[str, torch.Tensor]]:
    """A simulated rank's micro-batches (without workers, of a pipeline made endless): its
    spent lanes pad on, and the caller cuts the stream where no rank has data, as the loader
    does under torch.distributed."""
    if num_workers:
        loader = DataLoader(pipeline, num_workers=num_workers, multiprocessing_context="spawn")
        loader._pad_on = True
        # copied out of the workers' shared memory, whose every block holds a file descriptor
        # while kept: a run of many steps ran out of them ("Too many open files")
        return ({k: _owned(v) for k, v in item.items()} for item in loader)
    return (b.to_training() for b in pipeline)


def _owned(value: Any) -> Any:
    """A tensor in memory of its own (others as they are)."""
    return value.clone() if isinstance(value, torch.Tensor) else value


def zephon_run(
    build: Build,
    world_size: int,
    steps: int,
    *,
    num_workers: int = 0,
    start: dict[str, Any] | None = None,
    first_step: int = 0,
) -> StepHashes:
    """Global-batch hashes of ``steps`` steps with ``world_size`` simulated ranks (each
    step's per-lane hashes too)."""
    batches = zephon_batches(
        build, world_size, steps, num_workers=num_workers, start=start, first_step=first_step
    )
    return StepHashes(batches)


def zephon_batches(
    build: Build,
    world_size: int,
    steps: int,
    *,
    num_workers: int = 0,
    start: dict[str, Any] | None = None,
    first_step: int = 0,
) -> list[list[dict[str, torch.Tensor]]]:
    """The global batches (micro-batches in rank order) of steps ``first_step..steps-1``."""
    per_rank: list[list[list[dict[str, torch.Tensor]]]] = []
    for rank in range(world_size):
        with as_rank(rank, world_size):
            pipeline = build().options(world_size=world_size, rank=rank)
            if not num_workers:  # the loader's workers pad on by `_pad_on` (`_rank_items`)
                pipeline = pipeline.with_lanes(list(pipeline.lanes), endless=True)
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
    # as the loader ends a finite stream on several ranks: at the first turn no rank has data
    # (each simulated rank pads on once its lanes are spent)
    for t in range(count):
        # real tokens, not loss targets: a step inside a long chat prompt has none of those
        if not any(
            bool((item["document_ids"] >= 0).any()) for rank in per_rank for item in rank[t]
        ):
            count = t
            break
    return [[p for rank in per_rank for p in rank[t]] for t in range(count)]


def fault_state(
    build: Build, world_size: int, fault_step: int, *, loader_workers: int | None = None
) -> dict[str, Any]:
    """The merged state of ``world_size`` ranks after ``fault_step`` steps, through JSON:
    of each rank's pipeline, or of its ``DataLoader`` with ``loader_workers`` workers."""
    states = []
    for rank in range(world_size):
        with as_rank(rank, world_size):
            pipeline = build().options(world_size=world_size, rank=rank)
            lanes = len(pipeline.lanes)
            if loader_workers is not None:
                loader = DataLoader(
                    pipeline, num_workers=loader_workers, multiprocessing_context="spawn"
                )
                loader._pad_on = True  # spent lanes pad on, as under torch.distributed
                run: Any = loader
            else:
                # spent lanes pad on (their states moving with them), as under torch.distributed
                run = pipeline.with_lanes(list(pipeline.lanes), endless=True)
            for i, _ in enumerate(run):
                if i + 1 == fault_step * lanes:
                    break
            states.append(run.state_dict())
    merged: dict[str, Any] = json.loads(json.dumps(merge_states(states)))
    return merged


def fault_run(
    build: Build,
    before: int,
    after: int,
    fault_step: int,
    steps: int,
    *,
    loader_workers: int | None = None,
) -> StepHashes:
    """Hashes of a run on ``before`` ranks that saves at ``fault_step`` (the pipelines'
    states, or with ``loader_workers`` their DataLoaders') and resumes on ``after`` ranks."""
    head = zephon_run(build, before, fault_step, num_workers=loader_workers or 0)
    merged = fault_state(build, before, fault_step, loader_workers=loader_workers)
    tail = zephon_run(build, after, steps, start=merged, first_step=fault_step)
    return StepHashes.joined(head, tail)


_MAX_PASSES = 1000  # of the standard baseline over the documents of a "repeat" recipe


def standard_run(build: Build, world_size: int, steps: int) -> list[str]:
    """A DistributedSampler over the same documents, each rank packing its own (wrap)."""
    return [digest(parts) for parts in standard_batches(build, world_size, steps)]


def standard_batches(
    build: Build, world_size: int, steps: int
) -> list[list[dict[str, torch.Tensor]]]:
    """The standard loader's global batches (see ``standard_run``): as many as its documents
    give, ``steps`` at most. For a recipe whose source repeats (``exhaustion="repeat"``) it
    reads further passes, each in another order (``DistributedSampler.set_epoch``)."""
    from zephon_torch._lanes import doc_chain
    from zephon_torch.work.pointers import Pointer

    pipeline = build()
    source, pack = pipeline._source, pipeline._pack
    assert pack is not None and pipeline._microbatch_size is not None
    chain = doc_chain(pipeline)  # the recipe's own per-document work, bad rows as it says
    index = [
        (d, s, r)
        for d, ds in enumerate(source.datasets)
        for s, sh in enumerate(ds.shards)
        for r in range(sh.num_rows)
    ]
    repeat = getattr(source, "exhaustion", None) == "repeat"
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
        for epoch in range(_MAX_PASSES if repeat else 1):
            sampler.set_epoch(epoch)  # another order each pass, as a training loop sets
            before = len(stream)
            for i in sampler:
                dataset, shard, row = index[i]
                docs = chain.run(dataset, [Pointer(0, 0, shard, row)], chain.ops)
                stream.extend(
                    int(t) for d in docs for t in (d.tokens if d.tokens is not None else [])
                )
                if len(stream) >= need:
                    break
            if len(stream) >= need or len(stream) == before:  # enough, or a pass gave nothing
                break
        tokens = np.asarray(stream[: need - need % width] or [0], dtype=np.int64)
        ranks.append(tokens)
    out: list[list[dict[str, torch.Tensor]]] = []
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
        out.append(parts)
    return out
