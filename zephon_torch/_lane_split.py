"""Pure lane arithmetic: which canonical lanes a rank owns, and whether ranks are in step.

Invariant: the global stream is the (turn, lane) interleaving of L canonical lanes, and a lane's
output depends only on the recipe and its id. Rank r of W owns the contiguous block
``[r * L/W, (r+1) * L/W)``, so concatenating the ranks' turn-t outputs in rank order gives the
turn-t global batch for every W dividing L. All functions are keyword-only and side-effect free.
Public through ``zephon_torch.elastic``.
"""

from __future__ import annotations

from typing import Any

from zephon_torch.errors import ConfigError, StateMismatchError, integer_setting


def supported_world_sizes(*, canonical_replicas: int) -> list[int]:
    """Every world size that divides ``canonical_replicas``, ascending."""
    return [w for w in range(1, canonical_replicas + 1) if canonical_replicas % w == 0]


_REPLICAS_HINT = (
    " (set by `options(canonical_replicas=...)`, default 1: the largest number of ranks the "
    "run may ever use, chosen before its first step, as it is part of the recipe)"
)


def check_topology(
    *,
    canonical_replicas: int,
    world_size: int,
    rank: int,
    total_name: str = "`canonical_replicas`",
    total_hint: str = _REPLICAS_HINT,
    world_name: str = "`world_size`",
    rank_name: str = "`rank`",
) -> None:
    """Raise ``ConfigError`` unless all three are ints, ``world_size`` divides
    ``canonical_replicas`` (or the total named ``total_name``, e.g. a global batch size, with
    ``total_hint`` saying where it is set) and the rank fits."""
    canonical_replicas = integer_setting(canonical_replicas, total_name)
    world_size = integer_setting(world_size, world_name)
    rank = integer_setting(rank, rank_name)
    if canonical_replicas < 1:
        raise ConfigError(f"{total_name} must be positive, got {canonical_replicas}")
    if world_size < 1:
        raise ConfigError(f"{world_name} must be positive, got {world_size}")
    if canonical_replicas % world_size:
        supported = supported_world_sizes(canonical_replicas=canonical_replicas)
        raise ConfigError(
            f"{world_name} {world_size} does not divide {total_name} "
            f"{canonical_replicas}; supported world sizes: {supported}{total_hint}"
        )
    if not 0 <= rank < world_size:
        raise ConfigError(f"{rank_name} must be in [0, {world_size}), got {rank}")


def lanes_for_rank(
    *, canonical_replicas: int, world_size: int, rank: int, world_name: str = "`world_size`"
) -> list[int]:
    """The lanes rank ``rank`` of ``world_size`` owns, in emission order (``world_name``:
    where the world size came from, for errors)."""
    check_topology(
        canonical_replicas=canonical_replicas,
        world_size=world_size,
        rank=rank,
        world_name=world_name,
    )
    per_rank = canonical_replicas // world_size
    return list(range(rank * per_rank, (rank + 1) * per_rank))


def check_in_step(lanes: dict[str, Any], *, canonical_replicas: int, world_size: int) -> None:
    """Refuse a state (its ``lanes``: lane number to lane state, None for a lane not begun)
    that would put ``world_size`` ranks at different turns (see ``ranks_out_of_step``). A
    state saved mid-step on this world size is in step (the ranks went in step), and
    continues exactly; one saved mid-step on another may not be (lanes 0 and 1 a turn ahead
    of lanes 2 and 3, loaded on two ranks).

    Raises:
        StateMismatchError: naming the turns the lanes are at.
    """
    by_rank = ranks_out_of_step(lanes, canonical_replicas=canonical_replicas, world_size=world_size)
    if by_rank is not None:
        turns = {turn for row in by_rank if row is not None for turn in row}
        fits = [
            size
            for size in range(1, canonical_replicas + 1)
            if canonical_replicas % size == 0
            and ranks_out_of_step(lanes, canonical_replicas=canonical_replicas, world_size=size)
            is None
        ]
        raise StateMismatchError(
            {
                "lanes": (
                    f"saved mid-step: lanes at turns {sorted(turns)}, which would put the "
                    f"{world_size} ranks at different turns; resume on the world size it "
                    f"was saved on (the world sizes it is in step on: {fits}), or save at "
                    "the end of a step (every canonical_replicas / world_size micro-batches "
                    "per rank)",
                    "each rank's lanes at the turns of every other rank's",
                )
            }
        )


def ranks_out_of_step(
    lanes: dict[str, Any], *, canonical_replicas: int, world_size: int
) -> list[list[int] | None] | None:
    """Each rank's lane turns, in its lane order (``rank_turns``: None for a rank whose lanes
    are all spent), when ``world_size`` ranks holding ``lanes`` are not in step, else None.
    In step, the ranks compared have their lanes at the turns every other's are, offset by
    offset: ranks deliver micro-batches together. A lane not in ``lanes`` counts as not
    begun."""
    per_rank = canonical_replicas // world_size
    by_number = {int(key): lane for key, lane in lanes.items()}
    by_rank = [
        rank_turns([by_number.get(rank * per_rank + offset) for offset in range(per_rank)])
        for rank in range(world_size)
    ]
    compared = {tuple(turns) for turns in by_rank if turns is not None}
    return by_rank if len(compared) > 1 else None


MID_STEP = "this state was saved mid-step"
"""How the warning of a state loaded mid-step (``step_remainder``) begins."""


def step_remainder(lanes: list[dict[str, Any] | None]) -> int:
    """The micro-batches one rank (its ``lanes``' states, in its lane order) delivers before
    its lanes stand at one turn again, where they stand a turn apart (stopped mid-step); else
    0: at a step's end, or lanes further apart (ranks that ended at different turns, merged)."""
    turns = rank_turns(lanes)
    if not turns or max(turns) - min(turns) != 1:
        return 0
    return turns.count(min(turns))


def rank_turns(lanes: list[dict[str, Any] | None]) -> list[int] | None:
    """The turns of one rank's ``lanes`` (lane states, None for one not begun), or None where
    every lane is spent. A spent lane pads in step with its rank's lanes that have data, so
    its turn counts while one of them does; a rank whose lanes are all spent is not compared:
    its stream may have ended (a pipeline's ends at the first turn without data on its rank,
    turns before another rank's)."""
    if lanes and all(lane is not None and lane["done"] for lane in lanes):
        return None
    return [0 if lane is None else int(lane["turn"]) for lane in lanes]
