"""``zephon-torch inspect PATH --validate``: read every row of a dataset before a job does.

A job stops at its first bad row (or, under ``bad_rows="skip"``, counts it): hours in, on a row
that one pass over the data would have shown. This pass reads every row of every shard as a
pipeline's reading does, and, given the field the job takes (``--text-field`` for ``tokenize``,
``--token-field`` for ``pretokenized``, ``--chat-field`` for ``tokenize_chat``), checks it as the
pipeline will. It reports each bad row and each unreadable shard by dataset, shard, row (and a
JSONL row's line), and goes on: the rows of a chunk that holds a bad one are read one by one.
Storage errors past the retries still end it (exit code 2, as any error of the command).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np

from zephon_torch._conversations import CHATML_ROLES, conversation_problem
from zephon_torch._words import counted
from zephon_torch.errors import DataError, row_fault
from zephon_torch.io import Dataset
from zephon_torch.io._projection import field_error, id_limit, text_of, token_ids
from zephon_torch.io._rows import name_line

CHUNK_ROWS = 4096  # rows read at once: a bad row costs its chunk a few more reads
VALIDATION_FAILED_EXIT = 1  # bad rows or shards found (2: the command itself failed)


@dataclass
class Findings:
    """What one pass found: counts, the first errors in full, and the ids seen."""

    rows: int = 0
    bad_rows: int = 0
    bad_shards: int = 0
    empty: int = 0  # rows whose text or ids are empty: they give no tokens
    errors: list[str] = field(default_factory=list)  # the first `shown`, in reading order
    smallest: int | None = None  # of the token ids, over the rows read
    largest: int | None = None
    roles: Counter[str] = field(default_factory=Counter)  # conversations' messages by role
    untrained: int = 0  # conversations without an assistant message

    def add_error(self, error: DataError, shown: int) -> None:
        if len(self.errors) < shown:
            self.errors.append(" ".join(str(error).split()))

    def add_conversation(self, messages: list[dict[str, Any]]) -> None:
        if not messages:
            self.empty += 1
            return
        roles = [message["role"] for message in messages]
        self.roles.update(roles)
        self.untrained += "assistant" not in roles

    def add_ids(self, ids: np.ndarray[Any, Any]) -> None:
        if not ids.size:
            self.empty += 1
            return
        low, high = int(ids.min()), int(ids.max())
        self.smallest = low if self.smallest is None else min(self.smallest, low)
        self.largest = high if self.largest is None else max(self.largest, high)


def validate(
    datasets: list[Dataset],
    *,
    text_field: str | None = None,
    token_field: str | None = None,
    chat_field: str | None = None,
    vocab_size: int | None = None,
    unopened: Sequence[DataError] = (),
    shown: int = 10,
    out: TextIO,
) -> int:
    """Read every row of ``datasets`` (one dataset, or its files opened one by one, those
    that did not open given as ``unopened``) and check ``text_field`` (a string, or UTF-8
    bytes), ``token_field`` (a 1-D list of integer ids in ``[0, vocab_size)``, else ``[0,
    2**31)``) or ``chat_field`` (a list of ``{"role": str, "content": str}``; its messages
    counted by role) in each; print what was found. Returns 0 where every row read and
    checked, else ``VALIDATION_FAILED_EXIT``."""
    found = Findings()
    for error in unopened:
        found.bad_shards += 1
        found.add_error(error, shown)
    started = time.perf_counter()
    shards = 0
    check = _checker(text_field, token_field, chat_field, vocab_size)
    for dataset in datasets:
        for shard in range(len(dataset.shards)):
            _validate_shard(dataset, shard, check, token_field, found, shown)
        shards += len(dataset.shards)
    seconds = time.perf_counter() - started
    checked = text_field or token_field or chat_field
    _report(shards + len(unopened), found, checked, seconds, shown, out)
    return VALIDATION_FAILED_EXIT if found.bad_rows or found.bad_shards else 0


def open_each(
    path: str,
    error: DataError,
    *,
    name: str,
    format_: str | None,
    index_cache_dir: str | None,
    columns: list[str] | None,
    storage_options: dict[str, Any] | None = None,
) -> tuple[list[Dataset], list[DataError]]:
    """The files of the dataset at ``path`` (local, or a URL with ``storage_options``), which
    did not open as a whole (for ``error``), each opened as a dataset of its own named
    ``name`` (a ``.npy`` token file with its offsets), less those of no rows that the whole
    open leaves out; and the errors of those that did not open (``error`` alone where its
    index is damaged). Raises ``error`` where the dataset cannot be taken apart: an ``hf://``
    path, or one MDS or LitData index."""
    from zephon_torch.io.dataset import NO_ROWS
    from zephon_torch.io.formats import INDEXED_FORMATS
    from zephon_torch.io.npy import token_files

    if path.startswith("hf://"):
        raise error
    try:
        detected, files = _files_of(path, format_, index_cache_dir, storage_options)
    except DataError:  # a damaged MDS or LitData index: the dataset has no file to open alone
        return [], [error]
    if detected in INDEXED_FORMATS:
        raise error
    datasets, unopened = [], []
    for file in token_files(files) if detected == "npy" else files:  # offsets go with tokens
        try:
            datasets.append(
                Dataset.from_path(
                    name,
                    file,
                    format=detected,
                    index_cache_dir=index_cache_dir,
                    storage_options=storage_options,
                    columns=columns,
                )
            )
        except DataError as damaged:
            # a complete file without rows, which the whole open leaves out (with a warning)
            if not (detected in ("parquet", "vortex", "npy") and damaged.detail == NO_ROWS):
                unopened.append(damaged)
    return datasets, unopened


def _files_of(
    path: str,
    format_: str | None,
    index_cache_dir: str | None,
    storage_options: dict[str, Any] | None,
) -> tuple[str, list[str]]:
    """The format of the dataset at ``path`` and its files (a URL's in the scheme it was
    written in), as the whole open finds them."""
    from zephon_torch.io._discover import find_files
    from zephon_torch.io._line_index import default_cache_dir
    from zephon_torch.io._remote import is_remote, list_remote
    from zephon_torch.io._retry import RetryPolicy

    if is_remote(path):
        listing = list_remote(
            path, format_=format_, storage_options=storage_options or {}, retry=RetryPolicy()
        )
        return listing.format, [found.url for _, found in listing.objects]
    cache = index_cache_dir or default_cache_dir()
    return find_files(path, format_=format_, exclude=os.path.abspath(cache))


def _validate_shard(
    dataset: Dataset,
    shard: int,
    check: Callable[[Any, Findings], str | None],
    token_field: str | None,
    found: Findings,
    shown: int,
) -> None:
    """Read ``shard`` a chunk at a time (``token_field`` as stored ids where the format keeps
    them so), each row of a chunk alone where the chunk holds a bad one, so many bad rows cost
    one read each; an error no row is at fault for ends the shard (the rest is not read)."""
    path = dataset.shards[shard].path
    size = dataset.shards[shard].num_rows

    def read(rows: list[int]) -> list[Any]:
        if token_field is not None:
            stored = dataset.read_tokens(shard, rows, token_field)
            if stored is not None:
                return list(stored)
        return list(dataset.read_rows(shard, rows))

    def tally(rows: list[int], values: list[Any]) -> None:
        """Check and count the rows read (``values``: each row's, or its error)."""
        for row, value in zip(rows, values, strict=False):
            problem = value if isinstance(value, DataError) else None
            if problem is None:
                message = check(value, found)
                if message is not None:
                    problem = DataError(message, dataset=dataset.name, shard=path, row=row)
            if problem is not None:
                name_line(problem, [dataset])
                found.bad_rows += 1
                found.add_error(problem, shown)
        found.rows += len(values)

    for start in range(0, size, CHUNK_ROWS):
        rows = list(range(start, min(start + CHUNK_ROWS, size)))
        try:
            values: list[Any] = read(rows)
        except DataError as error:
            if not row_fault(error):
                _shard_failed(error, dataset, found, shown)
                return
            values = []
            for row in rows:
                try:
                    values += read([row])
                except DataError as alone:
                    if not row_fault(alone):  # the rows before it are reported first
                        tally(rows, values)
                        _shard_failed(alone, dataset, found, shown)
                        return
                    values.append(alone)
        tally(rows, values)


def _shard_failed(error: DataError, dataset: Dataset, found: Findings, shown: int) -> None:
    name_line(error, [dataset])
    found.bad_shards += 1
    found.add_error(error, shown)


def _checker(
    text_field: str | None,
    token_field: str | None,
    chat_field: str | None,
    vocab_size: int | None,
) -> Callable[[Any, Findings], str | None]:
    """What is wrong with a row (a dict, or stored ids), as tokenize, pretokenized or
    tokenize_chat would find it; None where nothing is, its text, ids or messages then counted
    in the findings."""
    limit, bound = id_limit(vocab_size)

    def check(value: Any, found: Findings) -> str | None:
        if token_field is not None:
            if isinstance(value, dict):
                try:
                    value = token_ids(value.get(token_field))
                except (TypeError, ValueError) as error:
                    return field_error(token_field, value, error)
            ids = np.asarray(value)
            if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= limit):
                bad = int(ids[(ids < 0) | (ids >= limit)][0])
                return f"field {token_field!r} holds token id {bad}; ids must lie in [0, {bound})"
            found.add_ids(ids)
        elif text_field is not None:
            try:
                found.empty += not text_of(value, text_field)
            except ValueError as error:
                return str(error)
        elif chat_field is not None:
            problem = conversation_problem(chat_field, value)
            if problem is not None:
                return problem
            found.add_conversation(value[chat_field])
        return None

    return check


def _report(
    shards: int,
    found: Findings,
    checked: str | None,
    seconds: float,
    shown: int,
    out: TextIO,
) -> None:
    read = f"{counted(found.rows, 'row')} of {counted(shards, 'shard')} in {seconds:.2f} s"
    field_words = f"; field {checked!r} checked in each" if checked else ""
    problems = []
    if found.bad_rows:
        problems.append(counted(found.bad_rows, "bad row"))
    if found.bad_shards:
        problems.append(f"{counted(found.bad_shards, 'shard')} unreadable past an error")
    verdict = ", ".join(problems) if problems else "no bad row"
    print(f"validate: {verdict}: read {read}{field_words}", file=out)
    if found.empty:
        are = "row is" if found.empty == 1 else "rows are"
        print(f"  {found.empty:,} {are} empty (they give no tokens)", file=out)
    if found.smallest is not None:
        print(
            f"  token ids from {found.smallest:,} to {found.largest:,} in the rows without error "
            "(a run refuses ids outside [0, vocab_size) of its tokenizer or model)",
            file=out,
        )
    if found.roles:
        _report_roles(found, out)
    for error in found.errors:
        print(f"  {error}", file=out)
    more = found.bad_rows + found.bad_shards - len(found.errors)
    if more > 0:
        print(f"  ... and {more:,} more (--show-errors sets how many are printed)", file=out)


def _report_roles(found: Findings, out: TextIO) -> None:
    """The conversations' messages by role, the roles the built-in chatml template (the
    default) refuses, and the conversations it would train on nothing of."""
    by_role = ", ".join(f"{role!r} {n:,}" for role, n in found.roles.most_common())
    print(f"  messages by role: {by_role}", file=out)
    unknown = [role for role in found.roles if role not in CHATML_ROLES]
    if unknown:
        print(
            f"  roles the built-in chatml template (tokenize_chat's default) refuses: "
            f"{', '.join(map(repr, unknown))}; rename them with a map before tokenize_chat, "
            "or pass a template of your own",
            file=out,
        )
    if found.untrained:
        have = "conversation has" if found.untrained == 1 else "conversations have"
        print(
            f"  {found.untrained:,} {have} no 'assistant' message: with chatml nothing of "
            "them is trained on (every label -100)",
            file=out,
        )
