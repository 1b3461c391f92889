"""Warnings of what the lanes will read, or did: a weighted dataset with fewer documents than
lanes (the lanes past its count never read it), and an iteration from a spent state that gave
nothing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zephon_torch._caller import warn

if TYPE_CHECKING:
    from zephon_torch.work import StaticMixtureWorkSource

_NAMED = 5  # the datasets a warning of many names


def warn_if_fewer_rows_than_lanes(source: StaticMixtureWorkSource, num_lanes: int) -> None:
    """Warn of the weighted datasets with fewer documents than lanes: lane l reads documents
    l, l + L, ... of each pass, so the lanes past its row count never read it. One warning for
    them all (a mixture of hundreds of small sources gave one each)."""
    few = [
        (name, layout.num_rows)
        for name, weight, layout in zip(source.names, source.weights, source.layouts)
        if weight > 0 and 0 < layout.num_rows < num_lanes
    ]
    repeat = source.exhaustion == "repeat"
    if len(few) == 1:
        name, rows = few[0]
        effect = (
            f"its share of every global batch is about {rows}/{num_lanes} of its weight"
            if repeat
            else f"its documents reach only {rows} lanes' batches"
        )
        warn(
            f"dataset {name!r} has {rows} documents, fewer than the {num_lanes} lanes "
            f"(canonical_replicas): lanes {rows} to {num_lanes - 1} never read it, so "
            f"{effect}. Split it into more documents or use fewer lanes.",
        )
    elif few:
        named = ", ".join(f"{name!r} ({rows})" for name, rows in few[:_NAMED])
        more = f" and {len(few) - _NAMED} more" if len(few) > _NAMED else ""
        effect = (
            f"each one's share of every global batch is about its documents/{num_lanes} of "
            "its weight"
            if repeat
            else "each one's documents reach only that many lanes' batches"
        )
        warn(
            f"{len(few)} datasets have fewer documents than the {num_lanes} lanes "
            f"(canonical_replicas): {named}{more}. The lanes past a dataset's document count "
            f"never read it, so {effect}. Split them into more documents or use fewer lanes.",
        )


def warn_if_spent(resumed: bool, delivered: int) -> None:
    """Warn that an iteration gave no data though it started from a state (a spent one: every
    lane ran out under ``exhaustion="stop"``); iterating again continues from there, as it does
    after a partial pass. A loop over epochs would otherwise see one epoch and then silence.
    Checked at the end, on what came: a lane's last state before its end can read not done."""
    if resumed and not delivered:
        warn(
            "this iteration gave no data: every lane of this pipeline is spent "
            "(exhaustion='stop'), and iterating again continues from there. Start a fresh "
            "pipeline (or load an earlier state) for another pass, or use exhaustion='repeat' "
            "and stop on a step budget",
        )
