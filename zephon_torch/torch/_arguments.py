"""Arguments of torch's DataLoader that ``zephon_torch.torch.DataLoader`` decides itself: each
refused with the reason and the setting that does the job, not Python's bare TypeError."""

from __future__ import annotations

import multiprocessing.context
from typing import Any

from zephon_torch.errors import ConfigError, integer_setting

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


def checked_workers(num_workers: object, prefetch_factor: object) -> tuple[int, int | None]:
    """``num_workers`` and ``prefetch_factor`` as plain ints (the factor None where not given),
    else a ``ConfigError`` naming the one at fault: torch's loader takes ``num_workers=2.0``
    and fails at the first iteration on a bare TypeError, and a string where it compares."""
    workers = integer_setting(num_workers, "`num_workers`")
    if workers < 0:
        raise ConfigError(f"`num_workers` must be >= 0, got {workers}")
    if not workers or prefetch_factor is None:
        return workers, None
    factor = integer_setting(prefetch_factor, "`prefetch_factor`")
    if factor < 1:
        raise ConfigError(f"`prefetch_factor` must be >= 1, got {factor}")
    return workers, factor


def checked_context(context: object) -> None:
    """A ``ConfigError`` for a ``multiprocessing_context`` that is neither None, a start method
    this platform has, nor a multiprocessing context: a Lightning data module took any and
    failed only when the trainer first asked for a loader, after setting up the model."""
    if context is None or isinstance(context, multiprocessing.context.BaseContext):
        return
    methods = multiprocessing.get_all_start_methods()
    if not isinstance(context, str) or context not in methods:
        raise ConfigError(
            f"`multiprocessing_context` must be one of {methods} or a multiprocessing "
            f"context, got {context!r}"
        )
