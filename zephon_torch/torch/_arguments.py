"""Arguments of torch's DataLoader that ``zephon_torch.torch.DataLoader`` decides itself: each
refused with the reason and the setting that does the job, not Python's bare TypeError."""

from __future__ import annotations

from typing import Any

from zephon_torch.errors import ConfigError

_ORDER = (
    "the pipeline decides the order: `StaticMixtureWorkSource(seed=..., shuffle=...)` and "
    "the pipeline's `.shuffle(...)`"
)
# torch DataLoader arguments this loader decides itself, and why
_DECIDED = {
    "batch_size": "each item is a whole micro-batch: set its size with the pipeline's "
    "`.batch(microbatch_size)`",
    "batch_sampler": "the pipeline decides the order and the batches",
    "sampler": _ORDER,
    "shuffle": _ORDER,
    "drop_last": "a finite stream ends with padded micro-batches, never a short one",
    "collate_fn": "items are training dicts of tensors already",
    "in_order": "items come in the one order the pipeline decides, whatever the workers",
    "generator": "the data depends on the pipeline's seed alone, not torch's random state",
}


def refuse_torch_arguments(others: dict[str, Any]) -> None:
    """A ``ConfigError`` for arguments of torch's DataLoader this loader does not take."""
    for name in others:
        why = _DECIDED.get(name, "not an argument of zephon_torch.torch.DataLoader")
        raise ConfigError(f"`{name}` is not taken: {why}")
