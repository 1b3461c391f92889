"""A recipe for `zephon-torch verify examples/recipe_64.py --plot docs/verify.png`.

The demo mix on 64 lanes (so 8, 16, 32 and 64 ranks all divide L) with short rows, and one
chunk of read-ahead per reader: 64 lanes x 2 sources start quickly on a laptop.
"""

from __future__ import annotations

from zephon_torch import Pipeline
from zephon_torch.demo import demo_pipeline


def pipeline() -> Pipeline:
    return demo_pipeline(canonical_replicas=64, max_length=64, microbatch_size=1).options(
        read_ahead=1
    )
