"""A user stateful operator: a length curriculum whose progress is saved with the data state.

    python examples/curriculum_filter.py

Early in training only short documents pass; the cap on document length grows with every
document the filter has seen (one filter per lane and source). The filter's counter is part
of the pipeline state, so a resume continues the curriculum exactly where it was. Each
micro-batch prints its longest document piece beside the longest of the same pipeline without
the filter: rows of 1,024 tokens, so a piece is as long as its document unless the document
runs across a row's end.
"""

from __future__ import annotations

import json
from typing import Any

import numpy.typing as npt

from zephon_torch.demo import demo_pipeline
from zephon_torch.ops.stateful import StatefulFilter


class LengthCurriculum(StatefulFilter):
    """Keep documents of at most ``start + growth * seen`` tokens."""

    name = "length_curriculum_v1"

    def __init__(self, start: int = 128, growth: int = 2) -> None:
        self.start = start
        self.growth = growth
        self.seen = 0

    def keep(self, tokens: npt.NDArray[Any], source: str) -> bool:
        cap = self.start + self.growth * self.seen
        self.seen += 1
        return len(tokens) <= cap

    def state_dict(self) -> dict[str, Any]:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seen = state["seen"]


def main() -> None:
    plain = demo_pipeline(canonical_replicas=2, max_length=1024, microbatch_size=4)
    pipeline = plain.stateful_filter(lambda lane: LengthCurriculum())
    for step, (batch, unfiltered) in enumerate(zip(pipeline, plain)):
        longest = max(n for row in batch.lengths for n in row)
        without = max(n for row in unfiltered.lengths for n in row)
        print(
            f"micro-batch {step:2d} (lane {batch.lane}): longest piece {longest:4d} tokens "
            f"(without the curriculum {without:4d})"
        )
        if step == 9:
            break
    state = pipeline.state_dict()
    seen = {k: v["pack"]["readers"][0]["filter"] for k, v in state["lanes"].items()}
    print("curriculum state per lane (first source's filter):", seen)
    print(f"state size: {len(json.dumps(state))} bytes")


if __name__ == "__main__":
    main()
