"""The ``zephon-torch`` command line: ``demo`` runs the main job on the embedded default."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _demo(args: argparse.Namespace) -> int:
    from zephon_torch.demo import DEMO_MIXTURE, demo_pipeline, run_demo

    print("building the demo corpus and tokenizer (cached after the first run) ...", flush=True)
    pipeline = demo_pipeline(
        tokenizer_id=args.tokenizer,
        canonical_replicas=args.lanes,
        max_length=args.max_length,
        microbatch_size=args.microbatch_size,
        parallelism=args.parallelism,
    )
    report = run_demo(pipeline, steps=args.steps)
    print(f"lanes (canonical_replicas): {args.lanes}, global steps: {report.steps}")
    print(f"first batch input_ids shape: {list(report.first_batch_shape)}")
    print("delivered token shares (target):")
    for name, share in report.shares.items():
        print(f"  {name:6s} {share:7.2%}  ({DEMO_MIXTURE[name]:.0%})")
    print(
        f"tokens: {report.tokens:,} in {report.seconds:.2f} s = "
        f"{report.tokens / report.seconds:,.0f} tokens/s"
    )
    print(
        f"time to first batch: {report.time_to_first_batch:.3f} s; "
        f"state: {report.state_bytes:,} bytes"
    )
    return 0


def _verify(args: argparse.Namespace) -> int:
    from zephon_torch.verify import load_recipe, table, verify

    build = load_recipe(args.recipe)
    sizes = [int(w) for w in args.world_sizes.split(",")] if args.world_sizes else None
    workers = tuple(int(n) for n in args.workers.split(",")) if args.workers else ()
    runs = verify(
        build,
        steps=args.steps,
        world_sizes=sizes,
        workers=workers,
        fault_step=args.fault_step,
        standard=not args.no_standard,
    )
    print(table(runs))
    zephon = [r for r in runs if r.zephon]
    identical = all(r.hashes == zephon[0].hashes for r in zephon)
    print(
        f"\nverdict: zephon_torch {'IDENTICAL' if identical else 'DIVERGES'} across configurations"
    )
    return 0 if identical else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``zephon-torch`` console script."""
    parser = argparse.ArgumentParser(prog="zephon-torch", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run the 50:50 code/prose demo pipeline offline")
    demo.add_argument(
        "--tokenizer", default=None, help="hub id or local path (default: a BPE trained locally)"
    )
    demo.add_argument("--steps", type=int, default=25, help="global steps to run")
    demo.add_argument("--lanes", type=int, default=8, help="canonical_replicas (L)")
    demo.add_argument("--max-length", type=int, default=2048)
    demo.add_argument("--microbatch-size", type=int, default=8)
    demo.add_argument("--parallelism", type=int, default=None, help="default: 2 x CPUs")
    demo.set_defaults(run=_demo)
    check = commands.add_parser(
        "verify", help="check identical global batches across configurations"
    )
    check.add_argument("recipe", help="a Python file defining pipeline() -> Pipeline")
    check.add_argument("--steps", type=int, default=8)
    check.add_argument(
        "--world-sizes", default=None, help="comma list (default: divisors of L up to 64)"
    )
    check.add_argument(
        "--workers", default="2", help="DataLoader worker counts to add (comma list)"
    )
    check.add_argument("--fault-step", type=int, default=3, help="save here, resume on another W")
    check.add_argument(
        "--no-standard", action="store_true", help="skip the standard-loader baseline"
    )
    check.set_defaults(run=_verify)
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
