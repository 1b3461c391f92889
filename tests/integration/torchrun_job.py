"""One rank of a torchrun job: records global batches per step, saves or loads a loader state.

Run as ``torchrun --nproc_per_node=W torchrun_job.py --tokenizer T --out DIR ...``. Each step
takes this rank's lanes' micro-batches (one per owned lane), gathers them over ranks with the
gloo backend, and rank 0 writes the SHA-256 of every global batch to ``DIR/steps.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from tokenizers import Tokenizer

from tests.helpers import destroy_process_group, small_pipeline, two_sources
from zephon_torch.torch import DataLoader


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--lanes", type=int, default=4)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--save-at", type=int, default=-1)
    parser.add_argument("--load", default=None)
    parser.add_argument(
        "--last-rank-load", default=None, help="another state for the last rank to load"
    )
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--exhaustion", default="repeat")
    parser.add_argument("--rows", default="40,30", help="documents of the two datasets")
    parser.add_argument(
        "--last-rank-algorithm", default="wrap", help="another recipe on the last rank"
    )
    parser.add_argument("--microbatch", type=int, default=2, help="the micro-batch size")
    parser.add_argument(
        "--last-rank-microbatch", type=int, default=None, help="another micro-batch size there"
    )
    parser.add_argument(
        "--save-final", action="store_true", help="save the loader's state after the last step"
    )
    parser.add_argument(
        "--again-every", type=int, default=0, help="iterate the loader anew after this many items"
    )
    parser.add_argument(
        "--peek-steps", type=int, default=0, help="steps the bare pipeline gives before a loader"
    )
    parser.add_argument(
        "--peek-then",
        choices=["pipeline", "own-state"],
        default="pipeline",
        help="after peeking: the loader takes the pipeline, or loads its (this rank's) state",
    )
    parser.add_argument(
        "--until-sigterm",
        action="store_true",
        help="take SIGTERM as 'stop after the next step': touch DIR/ready at step 10, save then",
    )
    args = parser.parse_args()
    stopping: list[int] = []
    if args.until_sigterm:
        signal.signal(signal.SIGTERM, lambda *_: stopping.append(0))

    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    tokenizer = Tokenizer.from_file(args.tokenizer)
    rows = tuple(map(int, args.rows.split(",")))
    pipeline = small_pipeline(
        tokenizer,
        algorithm=args.last_rank_algorithm if rank == world - 1 else "wrap",
        microbatch_size=(args.last_rank_microbatch or args.microbatch)
        if rank == world - 1
        else args.microbatch,
        lanes=args.lanes,
        exhaustion=args.exhaustion,
        datasets=two_sources(*rows, shard_size=8),
    )
    assert pipeline.topology == (world, rank)
    lanes_per_rank = args.lanes // world
    steps: dict[int, str] = {}
    peeked = iter(pipeline) if args.peek_steps else iter(())
    for step in range(args.peek_steps):
        batches = [next(peeked).to_training() for _ in range(lanes_per_rank)]
        steps[step] = _global_digest(torch.cat([b["input_ids"] for b in batches]), world)
    data: Any = pipeline
    if args.peek_steps and args.peek_then == "own-state":
        data = small_pipeline(
            tokenizer, lanes=args.lanes, exhaustion=args.exhaustion,
            datasets=two_sources(*rows, shard_size=8), microbatch_size=args.microbatch,
        )  # fmt: skip
    loader = DataLoader(data, num_workers=args.workers, multiprocessing_context="spawn")
    if data is not pipeline:
        loader.load_state_dict(pipeline.state_dict())  # this rank's lanes only
    start = args.peek_steps
    if args.load:
        state = json.loads(Path(args.load).read_text())
        start = state["step"]  # every rank's, so that their collectives pair up
        if args.last_rank_load and rank == world - 1:
            state = json.loads(Path(args.last_rank_load).read_text())
        loader.load_state_dict(state)
    stream = _items(loader, args.again_every)
    for step in range(start, args.steps or 10**9):
        try:
            mine = torch.cat([next(stream)["input_ids"] for _ in range(lanes_per_rank)])
        except StopIteration:  # with exhaustion="stop": every rank must stop at the same step
            break
        steps[step] = _global_digest(mine, world)
        if args.until_sigterm and rank == 0 and step == 10:
            Path(args.out, "ready").touch()
        # every rank stops at one step: the one after the signal's (a step's batches still come)
        if args.until_sigterm and args.save_at < 0 and _any_rank(bool(stopping)):
            args.save_at = step + 2
        if step + 1 == args.save_at:
            state = loader.state_dict()  # a collective: every rank calls it
            if rank == 0:
                Path(args.out, "state.json").write_text(json.dumps(state))
            if args.until_sigterm:
                break
    if args.save_final:
        state = loader.state_dict()  # a collective: every rank calls it
        if rank == 0:
            Path(args.out, "final.json").write_text(json.dumps(state))
    if rank == 0:
        Path(args.out, "steps.json").write_text(json.dumps(steps))
    dist.barrier()
    destroy_process_group()


def _any_rank(flag: bool) -> bool:
    """Whether ``flag`` is set on any rank."""
    flags = torch.tensor([int(flag)])
    dist.all_reduce(flags, op=dist.ReduceOp.MAX)
    return bool(flags.item())


def _global_digest(mine: torch.Tensor, world: int) -> str:
    """The SHA-256 of a step's global batch: every rank's micro-batches, in rank order."""
    parts = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(parts, mine)
    return hashlib.sha256(torch.cat(parts).numpy().tobytes()).hexdigest()


def _items(loader: DataLoader, again_every: int) -> Iterator[dict[str, Any]]:
    """The loader's items, from a new ``iter(loader)`` after each ``again_every`` of them (as
    a trainer does with an epoch limit), until an iteration gives none."""
    while True:
        count = 0
        for item in loader:
            yield item
            count += 1
            if count == again_every:
                break
        if count == 0 or count < again_every or not again_every:
            return


if __name__ == "__main__":
    main()
