"""``skipping_bad``: the result of a step over a list where the items that raise a row's
``DataError`` are replaced, found by halving at a bounded cost."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_torch.errors import DataError
from zephon_torch.ops.document import skipping_bad


@settings(deadline=None)
@given(
    items=st.lists(st.integers(0, 1000), min_size=1, max_size=200),
    bad=st.sets(st.integers(0, 1000)),
)
def test_bad_items_replaced_in_place_at_bounded_cost(items: list[int], bad: set[int]) -> None:
    calls = 0

    def step(some: list[int]) -> list[int]:
        nonlocal calls
        calls += 1
        for item in some:
            if item in bad:
                raise DataError("bad", dataset="d", shard="s", row=item)
        return [2 * item for item in some]

    got = skipping_bad(step, items, lambda item, error: -1 - item if error.row == item else 0)
    assert got == [-1 - i if i in bad else 2 * i for i in items]
    found = sum(i in bad for i in items)
    # each bad item costs at most two calls per halving level, and the first call is made
    assert calls <= 1 + 2 * found * max(1, math.ceil(math.log2(len(items))))


@settings(deadline=None)
@given(
    items=st.lists(st.integers(0, 1000), min_size=1, max_size=200, unique=True),
    bad=st.sets(st.integers(0, 1000)),
    first=st.booleans(),
)
def test_the_item_an_error_names_is_cut_out_at_most_three_calls_each(
    items: list[int], bad: set[int], first: bool
) -> None:
    """With the named item found (the first bad one, or the last: processing order may differ
    from the list's), the good items stay in at most a few calls per bad one."""
    calls = 0

    def step(some: list[int]) -> list[int]:
        nonlocal calls
        calls += 1
        found = [item for item in some if item in bad]
        if found:
            row = found[0] if first else found[-1]
            raise DataError("bad", dataset="d", shard="s", row=row)
        return [2 * item for item in some]

    def named(some: list[int], error: DataError) -> int | None:
        return some.index(error.row) if error.row in some else None

    got = skipping_bad(step, items, lambda item, error: -1 - item, named)
    assert got == [-1 - i if i in bad else 2 * i for i in items]
    assert calls <= 1 + 3 * sum(i in bad for i in items)


def test_an_error_naming_no_row_is_raised() -> None:
    def step(some: list[int]) -> list[int]:
        raise DataError("a shard is corrupt", dataset="d", shard="s")

    with pytest.raises(DataError, match="corrupt"):
        skipping_bad(step, [1, 2, 3], lambda item, error: item)
