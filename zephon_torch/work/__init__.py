"""Work sources: which documents exist in which lane and pass, as pure pointer streams."""

from zephon_torch.work.mixture import StaticMixtureWorkSource, TokenEstimation
from zephon_torch.work.pointers import Pointer, PointerLayout, lane_length

__all__ = ["Pointer", "PointerLayout", "StaticMixtureWorkSource", "TokenEstimation", "lane_length"]
