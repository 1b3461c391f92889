"""Pure lane arithmetic: which canonical lanes a rank (and a loader worker) owns.

Invariant: the global stream is the (turn, lane) interleaving of L canonical lanes, and a lane's
output depends only on the recipe and its id. Rank r of W owns the contiguous block
``[r * L/W, (r+1) * L/W)``, so concatenating the ranks' turn-t outputs in rank order gives the
turn-t global batch for every W dividing L. All functions are keyword-only and side-effect free.
"""

from __future__ import annotations

from zephon_torch.errors import ConfigError


def supported_world_sizes(*, canonical_replicas: int) -> list[int]:
    """Every world size that divides ``canonical_replicas``, ascending."""
    return [w for w in range(1, canonical_replicas + 1) if canonical_replicas % w == 0]


def check_topology(*, canonical_replicas: int, world_size: int, rank: int) -> None:
    """Raise ``ConfigError`` unless ``world_size`` divides ``canonical_replicas`` and rank fits."""
    if canonical_replicas < 1:
        raise ConfigError(f"`canonical_replicas` must be positive, got {canonical_replicas}")
    if world_size < 1:
        raise ConfigError(f"`world_size` must be positive, got {world_size}")
    if canonical_replicas % world_size:
        supported = supported_world_sizes(canonical_replicas=canonical_replicas)
        raise ConfigError(
            f"`world_size` {world_size} does not divide `canonical_replicas` "
            f"{canonical_replicas}; supported world sizes: {supported}"
        )
    if not 0 <= rank < world_size:
        raise ConfigError(f"`rank` must be in [0, {world_size}), got {rank}")


def lanes_for_rank(*, canonical_replicas: int, world_size: int, rank: int) -> list[int]:
    """The lanes rank ``rank`` of ``world_size`` owns, in emission order."""
    check_topology(canonical_replicas=canonical_replicas, world_size=world_size, rank=rank)
    per_rank = canonical_replicas // world_size
    return list(range(rank * per_rank, (rank + 1) * per_rank))
