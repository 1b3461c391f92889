"""A recipe for `zephon-torch verify examples/recipe.py`: the demo mix on 8 lanes, small rows."""

from __future__ import annotations

from zephon_torch import Pipeline
from zephon_torch.demo import demo_pipeline


def pipeline() -> Pipeline:
    return demo_pipeline(canonical_replicas=8, max_length=256, microbatch_size=2)
