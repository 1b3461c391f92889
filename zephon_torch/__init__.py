"""zephon_torch: online tokenizing and packing data loader with elastic determinism."""

from zephon_torch._state import merge_states
from zephon_torch.errors import ConfigError, DataError, StateMismatchError, StorageError
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
