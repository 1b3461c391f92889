"""PyTorch glue: the IterableDataset, the loader that tracks delivered state, distributed."""

from zephon_torch.torch.dataset import PipelineDataset, to_device
from zephon_torch.torch.loader import DataLoader

__all__ = ["DataLoader", "PipelineDataset", "to_device"]
