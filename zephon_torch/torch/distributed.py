"""Where this process sits: rank and world size, and the all-gather that makes states global.

Rank and world size come from ``torch.distributed`` when it is initialised, else from the
``RANK``/``WORLD_SIZE`` environment (as torchrun sets them), else from explicit options, else a
single rank. An explicit option that contradicts the live process group is an error, and so is
a malformed environment value: silently training on the wrong lanes is the failure to avoid.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from zephon_torch.errors import ConfigError


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name} must be an integer, got {raw!r}") from None
    if value < 0:
        raise ConfigError(f"environment variable {name} must be >= 0, got {value}")
    return value


def distributed_ready() -> bool:
    """Whether a default process group is initialised."""
    return dist.is_available() and dist.is_initialized()


def resolve_topology(*, world_size: int | None, rank: int | None) -> tuple[int, int]:
    """``(world_size, rank)`` from the process group, the environment, or the options given."""
    if distributed_ready():
        found, source = (dist.get_world_size(), dist.get_rank()), "torch.distributed"
    else:
        env = (_env_int("WORLD_SIZE"), _env_int("RANK"))
        if (env[0] is None) != (env[1] is None):
            raise ConfigError(
                f"environment sets only one of WORLD_SIZE={os.environ.get('WORLD_SIZE')!r} and "
                f"RANK={os.environ.get('RANK')!r}; set both or neither"
            )
        if env[0] is None or env[1] is None:
            return (1 if world_size is None else world_size, 0 if rank is None else rank)
        found, source = (env[0], env[1]), "the RANK/WORLD_SIZE environment"
        if found[1] >= found[0]:
            raise ConfigError(f"RANK={found[1]} must be below WORLD_SIZE={found[0]}")
    for name, given, live in (("world_size", world_size, found[0]), ("rank", rank, found[1])):
        if given is not None and given != live:
            raise ConfigError(f"`{name}` option is {given}, but {source} says {live}")
    return found


def all_gather_lane_states(lanes: dict[str, Any]) -> dict[str, Any]:
    """Every rank's lane states merged, on every rank (a collective: call it on all ranks)."""
    if not distributed_ready() or dist.get_world_size() == 1:
        return dict(lanes)
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, lanes)
    merged: dict[str, Any] = {}
    for part in gathered:
        merged.update(part)
    return dict(sorted(merged.items(), key=lambda kv: int(kv[0])))


def equal_ending(
    items: Iterator[dict[str, Any]], *, lanes_per_turn: int, pad_id: int
) -> Iterator[dict[str, Any]]:
    """Yield ``items`` turn by turn (``lanes_per_turn`` each) until no rank has data left.

    Before each turn one all-reduce tells whether any rank still has an item; a rank that ran
    out fills the turn with all-padding copies of its last item's shape, so every rank yields
    the same number of micro-batches and the job ends on the same step everywhere.
    """
    template: dict[str, Any] | None = None
    while True:
        first = next(items, None)
        flag = torch.tensor([0 if first is None else 1])
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if int(flag.item()) == 0:
            return
        for i in range(lanes_per_turn):
            item = first if i == 0 else next(items, None)
            if item is None:
                if template is None:
                    raise RuntimeError("a rank with no data at all cannot pad an equal ending")
                item = padding_like(template, pad_id)
            else:
                template = item
            yield item


def padding_like(item: dict[str, Any], pad_id: int) -> dict[str, Any]:
    """An all-padding micro-batch shaped like ``item``: no target token, no loss."""
    ids = item["input_ids"]
    rows, width = ids.shape
    out = {
        "input_ids": torch.full_like(ids, pad_id),
        "labels": torch.full_like(item["labels"], -100),
        "loss_mask": torch.zeros_like(item["loss_mask"]),
        "position_ids": torch.arange(width).repeat(rows, 1),
        "document_ids": torch.full_like(item["document_ids"], -1),
        "source_ids": torch.full_like(item["source_ids"], -1),
        "cu_seqlens": torch.arange(rows + 1, dtype=torch.int32) * width,
        "max_seqlen": torch.tensor(width),
        "num_valid_tokens": torch.tensor(0),
    }
    if "attention_mask" in item:
        out["attention_mask"] = torch.eye(width, dtype=torch.bool).expand(rows, 1, width, width)
    return out
