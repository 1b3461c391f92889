"""``MixPack._run`` over token chunks (kept documents found by a search in the chunk's running
token sums, ``_take``; refused ones counted one by one) gives exactly what a step per document
gives (``loop_run`` below, the reference): the same blocks (parts, sizes, sources, starts,
owners), the same state after every block (counts, skips, carries, reader positions), the same
idle counts, and either resumes from the other's states. ``_take`` runs compiled
(``zephon_torch._native.take``) and as Python, as where the module is not built."""

from __future__ import annotations

import collections
import contextlib
import gc
import itertools
import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.property.test_packers import build as build_mixpack
from zephon_torch.ops import _wrap_blocks
from zephon_torch.ops._copy import as_arrays
from zephon_torch.ops._wrap_blocks import RowBlock
from zephon_torch.ops.columns import TokenChunk
from zephon_torch.ops.pack import MixPack
from zephon_torch.ops.packers import Piece
from zephon_torch.ops.read import DocumentReader

BRANCHES: collections.Counter[str] = collections.Counter()


def loop_run(
    node: MixPack,
    source: int,
    want: int,
    parts: list[Any],
    owners: list[Any],
    sizes: list[int],
    starts: list[bool],
) -> int:
    """The reference: ``_run`` taking the chunk's documents one at a time through ``_admit``."""
    taken = 0
    carried = node.carry[source]
    if carried is not None:
        piece = node._cut(source, carried, want)
        parts.append(piece.doc.tokens[piece.start : piece.end])  # type: ignore[index]
        owners.append((piece.doc.source, piece.doc.shard, piece.doc.row))
        sizes.append(piece.end - piece.start)
        starts.append(piece.start == 0)
        taken = piece.end - piece.start
        if taken == want:
            node.tokens[source] += taken
            return taken
    reader = node.readers[source]
    assert isinstance(reader, DocumentReader)
    got = reader.columns()
    if got is None:
        node.active[source] = False
        node.tokens[source] += taken
        return taken
    chunk, i = got
    while i < len(chunk) and taken < want:
        ids = chunk.tokens[i]
        size = len(ids)
        i += 1
        if not node._admit(source, size, chunk.shards[i - 1], chunk.rows[i - 1]):
            continue
        owners.append((source, chunk.shards[i - 1], chunk.rows[i - 1]))
        starts.append(True)
        room = want - taken
        if size > room:
            parts.append(ids[:room])
            sizes.append(room)
            node.carry[source] = Piece(chunk[i - 1], room, size)
            taken = want
        else:
            parts.append(ids)
            sizes.append(size)
            taken += size
    reader.advance(i)
    node.tokens[source] += taken
    return taken


def build(
    sources: list[list[int]],
    width: int,
    *,
    fast: bool,
    chunk_docs: int,
    runner_kind: str = "inline",
    eos: int | None = None,
    exhaustion: str = "stop",
    **mix: Any,
) -> MixPack:
    """A wrap MixPack over in-memory token columns; ``fast=False`` runs the reference loop."""
    node = build_mixpack(
        sources,
        "wrap",
        width,
        1,
        True,
        chunk_docs=chunk_docs,
        runner_kind=runner_kind,
        eos=eos,
        exhaustion=exhaustion,
        **mix,
    )
    if not fast:
        node._run = lambda *args: loop_run(node, *args)  # type: ignore[method-assign]
    else:
        take = node._take

        def counted(source: int, chunk: Any, first: int, stop: int, room: int, *rest: Any) -> Any:
            before = node.carry[source]
            got, after = take(source, chunk, first, stop, room, *rest)
            cut = node.carry[source] is not before and node.carry[source] is not None
            BRANCHES["calls"] += 1
            BRANCHES["cut" if cut else "no cut"] += 1
            BRANCHES["whole==0"] += after - first - cut == 0
            BRANCHES["first>0"] += first > 0
            BRANCHES["stops at a refused document"] += stop < len(chunk) and after == stop
            BRANCHES["chunk exhausted"] += after == len(chunk)
            BRANCHES["fills room exactly, no cut"] += (not cut) and got == room
            return got, after

        node._take = counted  # type: ignore[method-assign]
    node.reset(None)
    return node


def snapshot(node: MixPack, block: RowBlock) -> tuple[Any, ...]:
    return (
        [p.tolist() for p in as_arrays(block.parts)],
        block.sizes,
        block.sources,
        block.starts,
        block.owners,
        block.tokens,
        node.get_state(),
        [run.length for run in node._barren_runs],  # documents in a row giving nothing
        [None if c is None else (c.doc.source, c.doc.pos, c.start, c.end) for c in node.carry],
    )


def blocks(node: MixPack, rows: int) -> list[tuple[Any, ...]]:
    out = []
    limit = 10 + 200 * sum(r.layout.num_rows for r in node.readers)  # docs <= 80 tokens
    for _ in range(limit):
        block = node.wrap_rows(rows)
        out.append(snapshot(node, block))
        if block.tokens == 0:
            return out
    raise AssertionError("did not end")


def resume_points(steps: int, most: int = 24) -> list[int]:
    """Every step to resume at, or for a long run (one-token rows of thousands of tokens, each
    resume running to the end) `most` of them: the first and last few and an even spread."""
    if steps <= most:
        return list(range(steps))
    ends = [*range(4), *range(steps - 4, steps)]
    spread = [round(i * (steps - 1) / (most - len(ends) - 1)) for i in range(most - len(ends))]
    return sorted(set(ends + spread))


docs_st = st.lists(
    st.lists(st.one_of(st.integers(0, 3), st.integers(0, 80)), min_size=1, max_size=40),
    min_size=1,
    max_size=3,
)


@pytest.fixture(params=["compiled", "python"])
def take(request: pytest.FixtureRequest) -> Iterator[None]:
    """``_take`` compiled, or its Python version (as where ``zephon_torch._native`` is not
    built). Not ``monkeypatch``: a function-scoped fixture that hypothesis would refuse."""
    if request.param == "compiled":
        assert _wrap_blocks._native is not None, "zephon_torch._native was not built"
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_wrap_blocks, "_native", None)
        yield


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sources=docs_st,
    width=st.integers(1, 40),
    rows=st.integers(1, 8),
    chunk_docs=st.integers(1, 16),
    drop_short=st.integers(0, 4),
    drop_long=st.one_of(st.none(), st.integers(0, 90)),
    eos=st.one_of(st.none(), st.just(5)),
)
def test_take_is_the_loop(
    take: None,
    sources: list[list[int]],
    width: int,
    rows: int,
    chunk_docs: int,
    drop_short: int,
    drop_long: int | None,
    eos: int | None,
) -> None:
    mix = {"drop_shorter_than": drop_short, "drop_longer_than": drop_long}
    kw = {"chunk_docs": chunk_docs, "eos": eos, **mix}
    fast = blocks(build(sources, width, fast=True, **kw), rows)
    slow = blocks(build(sources, width, fast=False, **kw), rows)
    assert fast == slow
    for cut in resume_points(len(slow) - 1):
        for resume_fast, state in ((True, slow[cut][6]), (False, fast[cut][6])):
            node = build(sources, width, fast=resume_fast, **kw)
            node.reset(state)
            resumed = blocks(node, rows)
            # the runs of barren documents are not state: compare everything else
            assert [s[:7] + s[8:] for s in resumed] == [s[:7] + s[8:] for s in slow[cut + 1 :]]


def test_every_branch_of_take_is_exercised(take: None) -> None:
    rng = random.Random(0)
    BRANCHES.clear()
    for _ in range(300):
        sources = [
            [rng.choice([0, 1, 2, 3, rng.randint(1, 90)]) for _ in range(rng.randint(1, 60))]
        ]
        width, rows, chunk_docs = rng.randint(1, 40), rng.randint(1, 8), rng.randint(1, 16)
        kw: dict[str, Any] = {"chunk_docs": chunk_docs, "drop_shorter_than": rng.randint(0, 2)}
        fast = blocks(build(sources, width, fast=True, **kw), rows)
        slow = blocks(build(sources, width, fast=False, **kw), rows)
        assert fast == slow
    for branch in (
        "cut",
        "no cut",
        "whole==0",
        "first>0",
        "stops at a refused document",
        "chunk exhausted",
        "fills room exactly, no cut",
    ):
        assert BRANCHES[branch] > 0, (branch, dict(BRANCHES))


@pytest.mark.parametrize("runner_kind", ["inline", "threads"])
def test_repeat_and_idle_counts_match(runner_kind: str) -> None:
    # a source with empty documents in between (they reset nothing, the others reset _idle),
    # and one whose short documents are dropped: the same blocks and idle counts on both paths
    for sources, mix in (
        ([[0, 0, 5, 0, 0, 0, 7] * 5], {}),
        ([[3, 4, 5] * 10], {"drop_shorter_than": 4}),
    ):
        out = []
        for fast in (True, False):
            node = build(
                sources,
                4,
                fast=fast,
                chunk_docs=2,
                runner_kind=runner_kind,
                exhaustion="repeat",
                **mix,
            )
            out.append([snapshot(node, node.wrap_rows(3)) for _ in range(60)])
        assert out[0] == out[1]


def test_the_compiled_take_refuses_what_is_not_a_chunk_s_columns() -> None:
    native = _wrap_blocks._native
    assert native is not None, "zephon_torch._native was not built"
    chunk = TokenChunk(0, 0, 0, [np.arange(4), np.arange(3)], [0, 0], [5, 6])

    def call(chunk: Any = chunk, first: int = 0, stop: int = 2, room: int = 5, **out: Any) -> Any:
        lists = {"parts": [], "owners": [], "sizes": [], "starts": [], **out}
        return native.take(chunk, first, stop, room, 0, *lists.values())

    parts: list[Any] = []
    assert call(parts=parts) == (5, 2, 1)  # the first whole, then the second cut to 1 token
    assert [p.tolist() for p in as_arrays(parts)] == [[0, 1, 2, 3], [0]]
    assert all(type(p) is tuple for p in parts)  # spans: no view made
    with pytest.raises(TypeError, match="must be lists"):
        call(owners=())
    with pytest.raises(AttributeError):
        call(chunk=object())
    for first, stop, room in ((-1, 2, 5), (1, 0, 5), (0, 3, 5), (0, 2, 0)):
        with pytest.raises(ValueError, match="out of range"):
            call(first=first, stop=stop, room=room)
    chunk.ends = [9, 4, 7]  # not running sums: refused, nothing read outside the lists
    with pytest.raises(ValueError, match="do not ascend"):
        call()
    chunk.ends = [0, 4]  # one sum short of the documents
    with pytest.raises(ValueError, match="out of range"):
        call()


class _Columns:
    """A chunk's columns as ``take`` reads them, any of them replaceable."""

    def __init__(self, sizes: list[int]) -> None:
        self.bases: list[Any] = [np.arange(n) for n in sizes]
        self.firsts = [0] * len(sizes)
        self.stops = list(sizes)
        self.sizes = list(sizes)
        self.ends = [0, *itertools.accumulate(sizes)]
        self.shards = [object() for _ in sizes]  # held by the lists alone
        self.rows = [object() for _ in sizes]


def test_the_compiled_take_survives_a_collection_that_empties_the_columns() -> None:
    # the only code that runs during the call: Python 3.11 may run the collector on an
    # allocation (a span's or an owner's tuple), and a finalizer may empty the columns
    # mid-loop: refused, or (where the collector waits for the interpreter, 3.12 on) taken
    # whole; never read from the emptied lists (which once crashed the interpreter)
    native = _wrap_blocks._native
    assert native is not None, "zephon_torch._native was not built"
    count = 50
    chunk = _Columns([1] * count)
    out: tuple[list[Any], ...] = ([], [], [], [])

    class Emptying:
        armed = True

        def __del__(self) -> None:
            if not Emptying.armed:
                return
            if len(out[1]) >= 3:  # in the loop: the columns emptied
                Emptying.armed = False
                for column in vars(chunk).values():
                    column.clear()
            else:  # not yet: another for the next collection
                again = Emptying()
                again.me = again  # type: ignore[attr-defined]

    first = Emptying()
    first.me = first  # type: ignore[attr-defined]
    del first
    held = [(i, i, i) for i in range(5000)]  # the free 3-tuples in use: the owners allocate
    threshold = gc.get_threshold()
    gc.set_threshold(1)
    try:
        got = native.take(chunk, 0, count, count, 0, *out)
    except RuntimeError as error:
        assert "changed" in str(error)
    else:
        assert got == (count, count, 0) and len(out[1]) == count
    finally:
        gc.set_threshold(*threshold)
        Emptying.armed = False
        del held


def test_the_compiled_take_raises_the_first_error_of_a_chunk_s_columns() -> None:
    # a column that raises: its error, not a SystemError where the next column's code (a
    # property that handles an exception of its own) lost it before take returned
    native = _wrap_blocks._native
    assert native is not None, "zephon_torch._native was not built"

    class Chunk(_Columns):
        @property  # type: ignore[override]
        def ends(self) -> list[int]:
            raise KeyError("ends")

        @ends.setter
        def ends(self, value: list[int]) -> None:
            pass

        @property  # type: ignore[override]
        def bases(self) -> list[Any]:
            with contextlib.suppress(KeyError):
                {}["not here"]
            return [np.arange(3)]

        @bases.setter
        def bases(self, value: list[Any]) -> None:
            pass

    with pytest.raises(KeyError, match="ends"):
        native.take(Chunk([3]), 0, 1, 2, 0, [], [], [], [])
    with pytest.raises(TypeError):  # the first argument's error, the second never converted
        native.take(_Columns([3]), "0", 2**70, 2, 0, [], [], [], [])


@pytest.mark.parametrize("room", [2**62, 2**63 - 1])
def test_the_compiled_take_of_any_room_is_python_s(room: int) -> None:
    # ends[first] + room past 2**63 - 1 (Python's sum has no bound): every document taken
    # whole, as by the Python search, not refused as sums that do not ascend
    native = _wrap_blocks._native
    assert native is not None, "zephon_torch._native was not built"
    chunk = TokenChunk(0, 0, 0, [np.arange(n) for n in (3, 4, 5)], [0, 1, 2], [7, 8, 9])
    chunk.ends = [e + 2**62 for e in chunk.ends]  # sums from any start, as the search allows
    got, expected = [], []
    for search, out in ((native.take, got), (_wrap_blocks._search, expected)):
        lists: tuple[list[Any], ...] = ([], [], [], [])
        out.append(search(chunk, 1, 3, room, 0, *lists))
        out.append([[p.tolist() for p in as_arrays(lists[0])], *lists[1:]])
    assert (
        got
        == expected
        == [
            (9, 3, 0),
            [[[0, 1, 2, 3], [0, 1, 2, 3, 4]], [(0, 1, 8), (0, 2, 9)], [4, 5], [True, True]],
        ]
    )
