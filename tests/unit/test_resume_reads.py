"""Which documents a resumed lane reads again, read ahead for every lane (`_resume_reads`)."""

from __future__ import annotations

from typing import Any

import pytest

from zephon_torch._resume_reads import saved_documents


def _pack(carry: list[Any], bins: list[Any] | None = None) -> dict[str, Any]:
    packer = {} if bins is None else {"bins": bins, "ready": []}
    return {"readers": [], "carry": carry, "packer": packer}


def test_the_documents_of_carries_and_open_bins_by_source_once_each_in_order() -> None:
    state = {
        "turn": 3,
        "pack": _pack(
            [[[0, 1, 7, 5, 9]], []],
            bins=[[[1, 0, 2, 0, 4], [0, 1, 7, 0, 5]], [[0, 0, 3, 0, 2]]],
        ),
    }
    assert saved_documents(state) == {0: [(1, 7), (0, 3)], 1: [(0, 2)]}


def test_under_shuffle_the_rows_of_the_blocks_start() -> None:
    state = {"pack": {"block": 2, "emitted": 1, "start": _pack([[[0, 4, 11, 3, 8]]])}}
    assert saved_documents(state) == {0: [(4, 11)]}
    assert saved_documents({"pack": {"block": 0, "emitted": 0, "start": None}}) == {}


@pytest.mark.parametrize(
    "state",
    [
        None,
        {},
        {"pack": 3},
        {"pack": _pack([[[0, 1, 2]]])},  # a pointer of another length
        {"pack": _pack([[["0", 1, 2, 0, 1]]])},  # or type
        {"pack": _pack([[[0, 1.5, 2, 0, 1]]])},
        {"pack": {"readers": [], "carry": 7}},
    ],
)
def test_a_state_of_another_shape_reads_nothing_ahead(state: Any) -> None:
    """The restore itself then says what is wrong with it."""
    assert saved_documents(state) == {}
