"""Pure turn arithmetic: where a rank's stream of micro-batches ends, and in what order it comes.

A rank's stream is its lanes' micro-batches in (turn, lane) order. A finite stream ends at the
first turn in which none of them holds a token; a turn that a lane of a resumed state has
already begun is completed first. Streams of DataLoader workers, merged, are put back in that
one-process order, and a spent lane's final state is moved by turns so the ranks' final states
merge. No function here reads or builds anything: they order what they are given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from zephon_torch.ops.batch import Batch

T = TypeVar("T")
K = TypeVar("K")


def spent_at(state: dict[str, Any]) -> dict[str, Any]:
    """A lane's final state from ``state``, that of its batch in the empty turn that ended the
    stream (not delivered): spent, at that turn, so a state's ``step`` counts the turns run."""
    return {**state, "turn": int(state["turn"]) - 1}


def skip_spent_turns(states: dict[K, dict[str, Any] | None]) -> dict[K, dict[str, Any] | None]:
    """Where every lane of ``states`` is spent, those more than a turn behind the furthest
    move up to its turn: they would pad whole turns (a state merged from ranks that ended turns
    apart gave dozens of all-padding steps), where lanes one turn behind complete the turn in
    progress (a state saved mid-turn in the last turn). Otherwise ``states`` as they are."""
    if not states or any(s is None or not s["done"] for s in states.values()):
        return states
    ahead = max(int(s["turn"]) for s in states.values() if s is not None)
    return {
        lane: s if s is None or s["turn"] >= ahead - 1 else {**s, "turn": ahead}
        for lane, s in states.items()
    }


def padded_to(states: dict[K, dict[str, Any]], turn: int) -> dict[K, dict[str, Any]]:
    """A finished rank's spent lane ``states`` as they stand at ``turn``, the step of the ranks
    going on: a spent lane pads in step with them, and its padding moves its turn alone (as
    under torch.distributed). Left behind in a merged state, loaded, they padded every turn
    between, ahead of the others' data (a rank ended at step 40 merged with one saved at step
    50 gave 27 all-padding micro-batches first, on one process, and every global step after
    it shifted)."""
    return {lane: s if s["turn"] >= turn else {**s, "turn": turn} for lane, s in states.items()}


def cut_at_empty_turn(
    items: Iterable[T],
    *,
    turn: Callable[[T], int],
    tokens: Callable[[T], int],
    ahead: int,
    ended: Callable[[list[T]], object] | None = None,
) -> Iterator[T]:
    """A rank's micro-batches, given in (turn, lane) order, up to the first turn in which none
    holds a token: where a rank's finite stream ends, in one process or across its workers.

    Items with tokens go out at once; all-padding ones wait until their turn shows tokens (then
    go out in order), so a turn's first batch is not held up by the lanes after it. A turn below
    ``ahead`` (a lane of the resumed state has already begun a later one) always counts as
    holding tokens, so it is completed. ``ended`` is given the empty turn's items where the
    stream is cut.
    """
    current: int | None = None
    live = False
    held: list[T] = []
    for item in items:
        if turn(item) != current:
            if current is not None and not live:
                if ended is not None:
                    ended(held)
                return
            current, live, held = turn(item), turn(item) < ahead, []
        if tokens(item) == 0 and not live:
            held.append(item)
            continue
        live = True
        yield from held
        held = []
        yield item


def cut_lone_lane(
    step: Callable[[], Batch], *, ahead: int, ended: Callable[[list[Batch]], object]
) -> Iterator[Batch]:
    """``cut_at_empty_turn`` for a single lane, where each turn is one batch, without its
    bookkeeping: ``step()``'s batches up to the first all-padding one whose turn is not below
    ``ahead`` (given to ``ended``)."""
    while True:
        batch = step()
        if batch.num_tokens == 0 and batch.turn >= ahead:
            ended([batch])
            return
        yield batch


def in_lane_order(
    items: Iterable[T],
    *,
    key: Callable[[T], tuple[int, int]],
    turns: dict[int, int],
) -> Iterator[T]:
    """Items keyed ``(turn, lane)``, given in any order in which each lane's own items come in
    turn order (DataLoader workers, merged), re-sequenced to the one-process order: the lane
    with the lowest next turn first, ties by lane. ``turns``: each lane's first turn. Holds
    only the items that arrive early (at most the lanes' spread in turns, times the lanes).
    """
    due = dict(sorted(turns.items()))
    early: dict[tuple[int, int], T] = {}
    for item in items:
        early[key(item)] = item
        while True:
            lane = min(due, key=lambda lane: (due[lane], lane))
            ready = early.pop((due[lane], lane), None)
            if ready is None:
                break
            due[lane] += 1
            yield ready
