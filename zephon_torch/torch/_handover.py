"""A pipeline given to a torch loader: the loader iterates its own copy (``Pipeline.to_torch``),
so the pipeline it was made from does not move with it, and a state loaded into that pipeline
afterwards does not reach it. Both would otherwise go unsaid, and each repeats data after a
resume: a checkpoint of ``pipeline.state_dict()`` holds where the loader started, and a loader
made before ``pipeline.load_state_dict(state)`` starts where the pipeline stood when it was made.

So a dataset made by ``to_torch()`` remembers the pipeline it was made from (weakly) and how
many states had been loaded into it then (``Pipeline._loads``):

- once a batch of the dataset reaches the training loop in this process, the pipeline's own
  ``state_dict()`` raises, saying which state to save, until the pipeline itself is iterated or
  loaded again (``Pipeline._handed``). A torch loader's workers get the batches in other
  processes: only the library's DataLoader, whose workers send them through it, and a torch
  loader without workers tell;
- a dataset whose pipeline has loaded a state since it was made, and which has loaded none of
  its own since, refuses to start a pass.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from zephon_torch.errors import ConfigError

if TYPE_CHECKING:
    from zephon_torch.pipeline import Pipeline

_SAVE_INSTEAD = {
    "loader": "save `loader.state_dict()` and resume with `loader.load_state_dict(state)`",
    "dataset": (
        "save the loader's state (torchdata's StatefulDataLoader), or the dataset's "
        "`state_dict()` without workers, and resume through it"
    ),
}
_MADE_BY = {
    "loader": "a zephon_torch.torch.DataLoader made from it",
    "dataset": "a torch dataset made from it by `to_torch()`",
}


class Handover:
    """What a ``PipelineDataset`` keeps of the pipeline it was made from (see the module)."""

    def __init__(self, pipeline: Pipeline) -> None:
        self._pipeline: weakref.ref[Pipeline] | None = weakref.ref(pipeline)
        self.loads: int | None = pipeline._loads  # None: the dataset loaded a state since
        self._stale: str | None = None  # the finding, where sent to a spawned worker

    def __getstate__(self) -> dict[str, Any]:
        """For a spawned DataLoader worker, which cannot follow the pipeline: what it finds
        now, in the process that holds the pipeline, travels instead."""
        return {"_pipeline": None, "loads": self.loads, "_stale": self.stale()}

    def __copy__(self) -> Handover:
        """A loader's copy of a dataset follows the same pipeline on its own."""
        clone = Handover.__new__(Handover)
        clone.__dict__.update(self.__dict__)
        return clone

    def own_state(self) -> None:
        """The dataset loaded a state of its own: its pipeline's later loads are not its."""
        self.loads = None
        self._stale = None

    def delivered(self, by: str) -> None:
        """A batch of the dataset reached the training loop (``by``: ``"loader"``, the
        library's DataLoader, or ``"dataset"``, a torch loader iterating it in this process):
        the pipeline's own state is behind the loop's from now on."""
        pipeline = self._pipeline() if self._pipeline is not None else None
        if pipeline is not None and pipeline._handed is None:
            pipeline._handed = (
                f"this pipeline's state_dict() is not what the training loop received: "
                f"{_MADE_BY[by]} delivered batches from its own copy of the pipeline (a "
                "loader never moves the pipeline it was made from), so this state is where "
                f"that loader started, and a resume from it would repeat data. Instead, "
                f"{_SAVE_INSTEAD[by]}. Iterating this pipeline, or loading a state into it, "
                "makes its own state_dict() current again"
            )

    def stale(self) -> str | None:
        """Why a pass must not start: the pipeline loaded a state after the dataset was made
        from it (and the dataset none since); None where it may."""
        if self._stale is not None or self.loads is None or self._pipeline is None:
            return self._stale
        pipeline = self._pipeline()
        if pipeline is None or pipeline._loads == self.loads:
            return None
        return (
            "the pipeline this loader's dataset was made from loaded a state after it was made "
            "(pipeline.load_state_dict after DataLoader(pipeline) or to_torch()): the loader "
            "iterates its own copy, made before that load, and would start where the pipeline "
            "stood then, not from the state loaded. Load the state into the loader "
            "(`loader.load_state_dict(state)`, or the dataset's), or make the loader after "
            "`pipeline.load_state_dict(state)`"
        )

    def check(self) -> None:
        """Raise ``ConfigError`` where a pass must not start (see ``stale``)."""
        reason = self.stale()
        if reason is not None:
            raise ConfigError(reason)
