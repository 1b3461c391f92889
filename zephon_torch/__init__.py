"""zephon_torch: online tokenizing and packing data loader with elastic determinism."""

import importlib as _importlib
from typing import TYPE_CHECKING
from typing import Any as _Any

from zephon_torch import _origin  # noqa: F401  (the importing process's pid, recorded now)
from zephon_torch.errors import (
    ConfigError,
    DataError,
    StateMismatchError,
    StorageError,
    ZephonWarning,
)

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
    "ZephonWarning",
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
# listed by dir(); `lightning` is left out: its extra may not be installed
_SUBMODULES = ("elastic", "io", "ops", "pipeline", "torch", "verify", "work")

if not TYPE_CHECKING:  # to a type checker, a name the package lacks stays an error

    def __getattr__(name: str) -> _Any:
        """`Batch`, `Pipeline` and `merge_states`, and the submodules (`zephon_torch.torch`,
        `zephon_torch.elastic`, ...), imported when first asked for."""
        if name in _LAZY:
            value = getattr(_importlib.import_module(_LAZY[name]), name)
        else:
            try:
                value = _importlib.import_module(f"{__name__}.{name}")
            except ImportError as error:
                # an AttributeError either way, as hasattr() and introspection expect; where
                # the submodule is there and something it needs is not (Lightning's extra),
                # saying what
                missing = error.name != f"{__name__}.{name}"
                said = f" (importing it failed: {error})" if missing else ""
                raise AttributeError(f"module {__name__!r} has no attribute {name!r}{said}") from (
                    error if missing else None
                )
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*__all__, "__version__", *_SUBMODULES})
