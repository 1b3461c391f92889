"""The ``zephon-torch`` command line: ``demo``, ``verify``, ``inspect``, ``index`` and ``state``.

Its parser and the checks on its arguments; what each command runs is in `_commands`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings
from collections.abc import Sequence
from functools import partial
from typing import Any

from zephon_torch._commands import (
    demo_command,
    index_command,
    inspect_command,
    state_command,
    verify_command,
)


def _int_at_least(text: str, least: int) -> int:
    """An integer of at least `least` (as "a positive integer" for 1)."""
    what = "a positive integer" if least == 1 else f"an integer >= {least}"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be {what}, got {value}")
    return value


_positive_int = partial(_int_at_least, least=1)
_non_negative_int = partial(_int_at_least, least=0)


def _int_list(text: str, *, least: int) -> tuple[int, ...]:
    """A comma list of integers of at least `least` ('' for none)."""
    return tuple(_int_at_least(p.strip(), least) for p in text.split(",")) if text.strip() else ()


def _runner_list(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in ("threads", "processes")]
    if unknown:
        raise argparse.ArgumentTypeError(f"runners are threads and processes, got {unknown}")
    return names


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"not JSON: {error}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    return value


def _column_list(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"must be comma-separated field names, got {text!r}")
    return names


_BROKEN_PIPE_EXIT = 141  # as a process ended by SIGPIPE shows in the shell (128 + 13)


def _warning_line(
    message: Warning | str, category: type[Warning], filename: str, lineno: int, line: Any = None
) -> str:
    """A warning as the command's own line: the library's warnings point at their caller,
    which from the command line is the launcher (``<frozen runpy>``), not a line of the
    user's."""
    return f"zephon-torch: {category.__name__}: {message}\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``zephon-torch`` console script."""
    parser = _parser()
    args = parser.parse_args(argv)
    _check_arguments(parser, args)
    shown = warnings.formatwarning  # how warnings print; recorded ones (tests) are untouched
    warnings.formatwarning = _warning_line
    try:
        return _run(args)
    finally:
        warnings.formatwarning = shown


def _run(args: argparse.Namespace) -> int:
    """The chosen command, its errors reported as the command's (demo, verify, state)."""
    try:
        if args.command in ("demo", "verify", "state"):  # inspect and index guard their own
            from zephon_torch._inspect import failed
            from zephon_torch.errors import ZephonError

            try:
                return int(args.run(args))
            except ZephonError as error:
                return failed(args.command, error, sys.stdout)
        return int(args.run(args))
    except BrokenPipeError:  # `zephon-torch inspect ... | head`: the reader has gone
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # for the exit's flush
        return _BROKEN_PIPE_EXIT


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zephon-torch",
        description="zephon_torch's command line: run the demo, check a recipe's determinism "
        "(verify), look into a dataset (inspect) or index it (index), or read a saved state "
        "(state).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    _add_demo(commands)
    _add_verify(commands)
    _add_dataset_commands(commands)
    state = commands.add_parser(
        "state",
        help="print what a saved state holds: the step, tokens delivered by source against "
        "the mixture, each lane's positions and open rows",
    )
    state.add_argument("path", help="a JSON state, or a torch checkpoint holding states")
    state.add_argument(
        "--json", action="store_true", help="print the states with their lanes as lists"
    )
    state.add_argument(
        "--trusted",
        action="store_true",
        help="load a torch checkpoint whole (weights_only=False: runs what its pickles name), "
        "for one holding objects beyond plain data and tensors; only for files you trust",
    )
    state.set_defaults(run=state_command)
    return parser


def _add_demo(commands: Any) -> None:
    demo = commands.add_parser("demo", help="run the 50:50 code/prose demo pipeline offline")
    demo.add_argument(
        "--tokenizer", default=None, help="hub id or local path (default: a BPE trained locally)"
    )
    demo.add_argument(
        "--steps", type=_positive_int, default=100, help="global steps to run (default: 100)"
    )
    demo.add_argument(
        "--lanes", type=_positive_int, default=8, help="canonical_replicas, L (default: 8)"
    )
    demo.add_argument(
        "--max-length", type=_positive_int, default=2048, help="tokens per row (default: 2048)"
    )
    demo.add_argument(
        "--microbatch-size", type=_positive_int, default=8, help="rows per micro-batch (default: 8)"
    )
    demo.add_argument(
        "--parallelism",
        type=_positive_int,
        default=None,
        help="tokenizer threads (default: 2 x CPUs, at most 32)",
    )
    demo.set_defaults(run=demo_command)


def _add_verify(commands: Any) -> None:
    check = commands.add_parser(
        "verify",
        help="check identical global batches across configurations",
        epilog="exit codes: 0 IDENTICAL; 1 DIVERGES (a configuration gave other batches or "
        "failed while running); 2 an error of the recipe, of its data (a DataError in the first, "
        "reference run) or of the arguments (before any comparison), or "
        "a --plot picture that could not be written (after the verdict); 3 INCOMPLETE (no "
        "divergence, but a configuration FAILED TO RUN for a reason of setup, such as a "
        "function spawned workers cannot pickle, or of the machine: an OSError, MemoryError; "
        "or no configuration gave a step to compare, or the settings left only the reference "
        "to run)",
    )
    check.add_argument("recipe", help="a Python file defining pipeline() -> Pipeline")
    check.add_argument(
        "--runners",
        type=_runner_list,
        default=None,
        help="other runners to compare: threads, processes (comma list; '' for none; "
        "default: processes)",
    )
    check.add_argument(
        "--steps",
        type=_positive_int,
        default=None,
        help="default: 8 (24 with --plot, 200 with --train)",
    )
    check.add_argument(
        "--world-sizes",
        type=partial(_int_list, least=1),
        default=None,
        help="comma list (default: divisors of L up to 64; with --plot: reference first, "
        "default 16,8,32,64)",
    )
    check.add_argument(
        "--workers",
        type=partial(_int_list, least=0),
        default=None,
        help="DataLoader worker counts to add (comma list; '' for none; default: 2)",
    )
    check.add_argument(
        "--fault-step",
        type=_non_negative_int,
        default=None,
        help="save here and resume from the last world size on the first, and from the first "
        "(a DataLoader's state, with workers) on the last: by default the most ranks and the "
        "fewest; the same W when only one runs (default: 3, at most steps - 1; with --plot: "
        "half the steps; 0: no fault)",
    )
    check.add_argument(
        "--no-standard", action="store_true", help="skip the standard-loader baseline"
    )
    check.add_argument(
        "--plot",
        default=None,
        metavar="PNG",
        help="draw batch fingerprints per step: a reference, runs resumed on other W after a "
        "fault, and the standard loader (needs matplotlib)",
    )
    check.add_argument(
        "--train",
        action="store_true",
        help="with --plot: also the loss curves of a tiny CPU model trained on each run",
    )
    check.set_defaults(run=verify_command)


def _add_dataset_commands(commands: Any) -> None:
    """``inspect`` and ``index``: one dataset path and the options to open it."""
    for name, run, summary in (
        (
            "inspect",
            inspect_command,
            "print a dataset's format, shards, rows, fields and first rows",
        ),
        (
            "index",
            index_command,
            "do the first open's counting ahead of a job (JSONL line indexes; row counts of "
            "remote Parquet and Vortex), so later opens skip it",
        ),
    ):
        command = commands.add_parser(name, help=summary)
        command.add_argument("path", help="a file, directory, glob or fsspec URL")
        command.add_argument("--format", default=None, help="default: detected from the files")
        command.add_argument(
            "--index-cache-dir",
            default=None,
            help="where line indexes and remembered row counts go (default: the library's)",
        )
        command.add_argument(
            "--storage-options",
            type=_json_object,
            default=None,
            help="a JSON object for the URL's fsspec file system, e.g. '{\"client_kwargs\": "
            '{"endpoint_url": "http://127.0.0.1:9000"}}\'',
        )
        command.add_argument(
            "--columns",
            type=_column_list,
            default=None,
            help="comma-separated fields to read (default all), e.g. to leave out an MDS "
            "'pkl' column, which is not read",
        )
        if name == "inspect":
            command.add_argument(
                "--rows", type=_positive_int, default=3, help="rows to preview (default 3)"
            )
            command.add_argument(
                "--validate",
                action="store_true",
                help="then read every row of every shard and report each bad one (exit code 1 "
                "where any is bad), as a job would meet them",
            )
            checked = command.add_mutually_exclusive_group()
            checked.add_argument(
                "--text-field",
                default=None,
                help="with --validate: check that each row holds this field as text, as "
                "tokenize(field=...) takes it",
            )
            checked.add_argument(
                "--token-field",
                default=None,
                help="with --validate: check that each row holds this field as token ids, as "
                "pretokenized(field) takes them (and print the ids' range)",
            )
            checked.add_argument(
                "--chat-field",
                default=None,
                help="with --validate: check that each row holds this field as a conversation, "
                "a list of {'role': str, 'content': str}, as tokenize_chat(field=...) takes it "
                "(and count its messages by role)",
            )
            command.add_argument(
                "--vocab-size",
                type=_positive_int,
                default=None,
                help="with --token-field: ids must lie below this (default: 2**31, as a run "
                "without vocab_size takes them)",
            )
            command.add_argument(
                "--show-errors",
                type=_non_negative_int,
                default=10,
                help="with --validate: bad rows printed in full (default 10)",
            )
        command.set_defaults(run=run)


def _check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse (``parser.error``) what the parser alone lets through."""
    if args.command == "verify" and not os.path.isfile(args.recipe):
        parser.error(f"verify: no recipe file {args.recipe!r}")
    if args.command == "inspect" and not args.validate:
        given = [
            option
            for option, value in (
                ("--text-field", args.text_field),
                ("--token-field", args.token_field),
                ("--chat-field", args.chat_field),
                ("--vocab-size", args.vocab_size),
            )
            if value is not None
        ]
        if given:
            parser.error(f"inspect: {', '.join(given)} applies with --validate")
    if getattr(args, "train", False) and not args.plot:
        parser.error("verify --train draws loss curves: it needs --plot")
    if getattr(args, "plot", None):
        given = [
            option
            for option, value in (
                ("--workers", args.workers),
                ("--runners", args.runners),
                ("--no-standard", args.no_standard or None),
            )
            if value is not None
        ]
        if given:
            parser.error(
                f"verify --plot draws its own runs (a reference, resumed runs and the standard "
                f"loader): {', '.join(given)} apply without --plot"
            )


if __name__ == "__main__":
    sys.exit(main())
