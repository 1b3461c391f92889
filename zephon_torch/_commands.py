"""What each ``zephon-torch`` command runs, given its parsed arguments (the parser: `cli`).

Each imports what it needs as it runs, never at import: parsing the command line imports no
torch, pyarrow or reader, so ``inspect`` and ``index`` run without torch and ``--help`` answers
at once.
"""

from __future__ import annotations

import argparse
import sys


def demo_command(args: argparse.Namespace) -> int:
    from zephon_torch._progress import progress
    from zephon_torch.demo import DEMO_MIXTURE, demo_pipeline, run_demo

    built = "corpus" if args.tokenizer else "corpus and tokenizer"  # a tokenizer given: no training
    print(f"building the demo {built} (cached after the first run) ...", flush=True)
    pipeline = demo_pipeline(
        tokenizer_id=args.tokenizer,
        canonical_replicas=args.lanes,
        max_length=args.max_length,
        microbatch_size=args.microbatch_size,
        parallelism=args.parallelism,
    )
    with progress(args.steps, "demo steps") as bar:
        if bar.active:  # the hook costs a stats() call: only when someone watches
            lanes = len(pipeline.lanes)
            pipeline = pipeline.options(
                stats_every=lanes * max(1, args.steps // 100),
                on_stats=lambda stats: bar.set(stats["batches"] // lanes),
            )
        report = run_demo(pipeline, steps=args.steps)
        bar.set(report.steps)
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
    from zephon_torch._compiled import NATIVE

    built = "built" if NATIVE else "not built (or ZEPHON_TORCH_NO_NATIVE set): numpy runs them"
    print(f"compiled loops (zephon_torch._native): {built}")
    return 0


def verify_command(args: argparse.Namespace) -> int:
    from zephon_torch._verdict import overall
    from zephon_torch.verify import Run, compare, load_recipe, table, verify

    build = load_recipe(args.recipe)
    sizes = list(args.world_sizes) if args.world_sizes else None
    runs: list[Run]
    if args.plot:
        from zephon_torch._plot import check_target

        check_target(args.plot)  # before the runs, which may take minutes
        steps = args.steps or (200 if args.train else 24)
        comparison = compare(
            build,
            steps=steps,
            fault_step=steps // 2 if args.fault_step is None else args.fault_step,
            world_sizes=sizes,
            train=args.train,
        )
        if comparison.note:
            print(f"note: {comparison.note}")
        runs = comparison.runs
    else:
        steps = args.steps or 8
        # the default fault lies inside the run (a fault at or after its end resumes nothing)
        fault_step = min(3, steps - 1) if args.fault_step is None else args.fault_step
        runs = verify(
            build,
            steps=steps,
            world_sizes=sizes,
            workers=(2,) if args.workers is None else args.workers,
            fault_step=fault_step or None,
            standard=not args.no_standard,
            runners=("processes",) if args.runners is None else args.runners,
        )
    print(table(runs))
    summary, code = overall(runs)
    scope = " (of the pictured runs only: no workers or runners; verify without --plot checks them)"
    print(f"\nverdict: {summary}{scope if args.plot else ''}")
    if args.plot:
        from zephon_torch._inspect import failed
        from zephon_torch._plot import render

        try:  # after the verdict: a picture that cannot be written loses no run
            render(comparison, args.plot, title=f"zephon-torch verify {args.recipe}")
        except OSError as error:
            return failed("verify", OSError(f"cannot write the picture: {error}"), sys.stdout)
        print(f"picture: {args.plot}")
    return code


def inspect_command(args: argparse.Namespace) -> int:
    from zephon_torch._inspect import run_inspect

    return run_inspect(
        args.path,
        format_=args.format,
        rows=args.rows,
        index_cache_dir=args.index_cache_dir,
        storage_options=args.storage_options,
        columns=args.columns,
        validate=args.validate,
        text_field=args.text_field,
        token_field=args.token_field,
        chat_field=args.chat_field,
        vocab_size=args.vocab_size,
        show_errors=args.show_errors,
    )


def index_command(args: argparse.Namespace) -> int:
    from zephon_torch._inspect import run_index

    return run_index(
        args.path,
        format_=args.format,
        index_cache_dir=args.index_cache_dir,
        storage_options=args.storage_options,
        columns=args.columns,
    )


def state_command(args: argparse.Namespace) -> int:
    from zephon_torch._state_report import run_state

    return run_state(args.path, as_json=args.json, trusted=args.trusted, out=sys.stdout)
