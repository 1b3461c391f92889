"""zephon_torch: online tokenizing and packing data loader with elastic determinism."""

import importlib
from typing import TYPE_CHECKING, Any

from zephon_torch.errors import ConfigError, DataError, StateMismatchError, StorageError

if TYPE_CHECKING:
    from zephon_torch._state import merge_states
    from zephon_torch.ops.batch import Batch
    from zephon_torch.pipeline import Pipeline

__all__ = [
    "Batch",
    "ConfigError",
    "DataError",
    "Pipeline",
    "StateMismatchError",
    "StorageError",
    "merge_states",
]
__version__ = "0.1.0"

# Imported on first use: these bring in torch (about 2 s), which reading data does not need, so
# `zephon_torch.io`, `zephon-torch inspect` and `index` start in well under a second.
_LAZY = {
    "Batch": "zephon_torch.ops.batch",
    "Pipeline": "zephon_torch.pipeline",
    "merge_states": "zephon_torch._state",
}


def __getattr__(name: str) -> Any:
    """`Batch`, `Pipeline` and `merge_states`, imported when first asked for."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'zephon_torch' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
