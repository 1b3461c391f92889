"""A LightningDataModule whose checkpoints carry the exact data position.

Lightning fetches a batch ahead of the step that uses it, so a loader's own state would run one
batch ahead of training. This module records a batch as delivered in
``on_before_batch_transfer``, which Lightning calls when the batch is about to be used, and puts
that state into every checkpoint (``state_dict``/``load_state_dict``). Resuming from the
checkpoint file continues with exactly the batches an uninterrupted run would have seen.

``import zephon_torch`` never imports Lightning; this module needs it
(``pip install 'zephon-torch[lightning]'``).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import torch

try:
    import lightning as L
except ImportError as error:
    raise ImportError(
        "zephon_torch.lightning needs Lightning: pip install 'zephon-torch[lightning]'"
    ) from error

from zephon_torch import Pipeline
from zephon_torch._caller import warn
from zephon_torch._lane_split import MID_STEP
from zephon_torch.elastic import rank_turns
from zephon_torch.errors import ConfigError, flag_setting
from zephon_torch.torch import DataLoader, to_device
from zephon_torch.torch._arguments import checked_context, checked_workers


class PipelineDataModule(L.LightningDataModule):
    """Serve a zephon_torch ``Pipeline`` to ``Trainer.fit``.

    Args:
        pipeline: the training recipe (rank and world size resolve from torch.distributed at
            start).
        val_pipeline: a validation recipe: each validation run sees its batches from the
            start, the same ones every time and after a resume (a loader with
            ``restart=True``). It must end (``exhaustion="stop"``), or ``limit_val_batches``
            must cut it. On several ranks its last steps may hold all-padding micro-batches
            (``num_valid_tokens == 0``), which the validation step must weigh as nothing.
            Without it, the module has no ``val_dataloader`` and Lightning skips validation.
        num_workers: DataLoader workers (a performance knob), for both.
        pin_memory: pin batches for asynchronous copies to the accelerator.
        multiprocessing_context: e.g. ``"spawn"``.
        mask_document_boundaries: no label crosses a document's end (``Batch.to_training``).
        attention_mask: each item also holds a [B, 1, S, S] bool mask, True where a token may
            attend: causal within its document (``Batch.to_training``), for both pipelines.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        *,
        val_pipeline: Pipeline | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        multiprocessing_context: str | None = None,
        mask_document_boundaries: bool = False,
        attention_mask: bool = False,
    ) -> None:
        super().__init__()
        # checked here, not when Lightning first asks for a loader (after the model is set up)
        for name, given in (("pipeline", pipeline), ("val_pipeline", val_pipeline)):
            if not isinstance(given, Pipeline) and (name == "pipeline" or given is not None):
                raise ConfigError(f"`{name}` must be a zephon_torch Pipeline, got {given!r}")
        num_workers = checked_workers(num_workers, None)[0]
        flag_setting(pin_memory, "`pin_memory`")
        checked_context(multiprocessing_context)
        self.pipeline = pipeline
        self.val_pipeline = val_pipeline
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.multiprocessing_context = multiprocessing_context
        self._flags = {  # what each item holds: checked here, as the loaders would
            "mask_document_boundaries": flag_setting(
                mask_document_boundaries, "`mask_document_boundaries`"
            ),
            "attention_mask": flag_setting(attention_mask, "`attention_mask`"),
        }
        self._loader: _Loader | None = None
        self._pending: dict[str, Any] | None = None
        self._restored = False  # a checkpoint's state came: Lightning's counter to align
        self._iterated = False  # the first pass checks that a resumed fit has its position
        if val_pipeline is not None:  # Lightning validates where a data module has one
            self.val_dataloader = self._val_dataloader  # type: ignore[method-assign]

    def _val_dataloader(self) -> DataLoader:
        """A loader of the validation pipeline whose every pass starts at its beginning."""
        assert self.val_pipeline is not None
        limit = getattr(self.trainer, "limit_val_batches", None)
        endless = self.val_pipeline.exhaustion == "repeat"
        if endless and (limit is None or isinstance(limit, float)):  # 1.0: all of it
            raise ConfigError(
                "`val_pipeline` never ends (exhaustion='repeat'), so each validation run "
                "would go on for ever: make it end (exhaustion='stop') or give the Trainer "
                "limit_val_batches=<a number of batches>"
            )
        return DataLoader(
            self.val_pipeline.to_torch(**self._flags),
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            multiprocessing_context=self.multiprocessing_context,
            restart=True,
        )

    def train_dataloader(self) -> DataLoader:
        """The loader; continues from a restored checkpoint state if there is one, else from
        where the previous loader's delivered batches end (Lightning builds a new loader at
        every epoch with ``reload_dataloaders_every_n_epochs``)."""
        if self._pending is None and self._loader is not None:
            self._pending = self._loader.state_dict()
        self._loader = _Loader(
            self,
            self.pipeline.to_torch(**self._flags),
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            multiprocessing_context=self.multiprocessing_context,
            deliver_on_use=True,
        )
        if self._pending is not None:
            _load(self._loader, self._pending)
            if self._restored and self.trainer is not None:
                _align_accumulation(self.trainer, self.pipeline, self._pending)
            self._pending = None
        self._restored = False
        return self._loader

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Record the batch as delivered: Lightning is about to train on it. (Validation
        batches come without their ``"zephon"`` entry: their loader has recorded them.)"""
        if self._loader is not None and isinstance(batch, dict) and "zephon" in batch:
            self._loader.mark_delivered(batch)
        return batch

    def transfer_batch_to_device(
        self, batch: Any, device: torch.device, dataloader_idx: int
    ) -> Any:
        """A training dict's tensors to `device` as `zephon_torch.torch.to_device` moves them
        (``max_seqlen`` stays on the host: kernels take it as an int); anything else as
        Lightning moves it."""
        if isinstance(batch, dict) and "input_ids" in batch:
            return to_device(batch, device)
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def state_dict(self) -> dict[str, Any]:
        """The data position for the checkpoint (a collective under torch.distributed). On
        several ranks, a warning says when it is taken mid-step: it then resumes on this
        world size only (``accumulate_grad_batches`` of L/W keeps checkpoints at step ends)."""
        if self._loader is not None:
            state = self._loader.state_dict()
            accumulate = getattr(self.trainer, "accumulate_grad_batches", 1)
            _warn_if_mid_step(self.pipeline, state, accumulate)
            return {"zephon": state}
        return {"zephon": self._pending}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from a checkpoint's data position."""
        state = state_dict.get("zephon")
        if state is None:
            return
        if self._loader is not None:
            _load(self._loader, state)
        else:
            self._pending = state
            self._restored = True


class _Loader(DataLoader):
    """The module's training loader: an iteration that gives no batch, the stream being spent
    (``exhaustion="stop"``), stops the fit. Lightning knows no length of a stream: with
    ``max_steps`` past the data and no ``max_epochs`` it started empty epochs for ever (and
    under DDP with workers, new workers for each)."""

    def __init__(self, module: PipelineDataModule, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._module = module
        self.loaded = False  # a state came: the module's, or Lightning's own restore

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Also Lightning's own restore: its fit loop keeps the loader's state it saved and
        loads it after the module has (not warned of again where the module loaded it), or
        alone where the checkpoint has no entry of this module's class name."""
        again = self.loaded
        self.loaded = True
        with warnings.catch_warnings():
            if again:
                warnings.filterwarnings("ignore", MID_STEP)
            super().load_state_dict(state)
        trainer = self._module.trainer
        if not again and trainer is not None and trainer.fit_loop.restarting:
            # Lightning's restore alone: the module's entry is missing (a class of another
            # name saved it), so its counts are aligned here
            _align_accumulation(trainer, self._module.pipeline, state)

    def __iter__(self) -> Iterator[dict[str, Any]]:  # type: ignore[override]
        trainer = self._module.trainer
        if not self._module._iterated and trainer is not None:
            self._module._iterated = True
            if trainer.global_step and not self.loaded:
                warn(
                    f"the fit resumes at global step {trainer.global_step} from a checkpoint "
                    f"that holds no data position (no `{type(self._module).__qualname__}` "
                    "entry: saved before this data module was used, or by a class of another "
                    "name): the data starts at its beginning, repeating what the run trained on"
                )
        given = 0
        for item in super().__iter__():
            given += 1
            yield item
        trainer = self._module.trainer
        if not given and trainer is not None:
            if not trainer.should_stop:
                warn(
                    f"the training data is spent at global step {trainer.global_step} "
                    "(exhaustion='stop'): the fit stops here",
                )
            trainer.should_stop = True


def _load(loader: _Loader, state: dict[str, Any]) -> None:
    """Load without the loader's warning of a state saved mid-step: Lightning restores its
    own count of the step's micro-batches with it (and ``state_dict`` warned at the save)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", MID_STEP)
        loader.load_state_dict(state)


def _lane_turns(pipeline: Pipeline, state: dict[str, Any]) -> list[int]:
    """The turns this rank's lanes stand at in ``state``, lane by lane (the load check's rule:
    spent lanes count while a lane of the rank has data; none where all are spent)."""
    return rank_turns([state["lanes"].get(str(lane)) for lane in pipeline.lanes]) or []


def _align_accumulation(trainer: L.Trainer, pipeline: Pipeline, state: dict[str, Any]) -> None:
    """Align Lightning's count of this epoch's batches with the optimizer steps it restored,
    for a checkpoint resumed on another world size.

    Lightning steps the optimizer when its per-rank batch count is a multiple of
    ``accumulate_grad_batches``, and restores that count from the checkpoint: saved on W
    ranks at step s it is s x L/W, which on W' ranks (``accumulate_grad_batches`` L/W') is
    out of line with the steps unless W' divides W. The data resumed exactly, but every
    later optimizer step then straddled two global batches. The count becomes s x L/W'
    (the same for the counts Lightning keeps beside it), the one a run on W' would have.
    A state saved mid-step (on W ranks, or on W' after a resume: Lightning's
    ``every_n_train_steps`` saves again at the first micro-batch of the resumed step) adds
    the micro-batches of the begun step this rank has done, where one optimizer step is one
    global step (``accumulate_grad_batches`` L/W', s the lanes' completed turns): its count
    of s x L/W + b on W=2 resumed on one process stepped after 1 micro-batch of the 2 left.
    """
    if not trainer.lightning_module.automatic_optimization:
        return  # the user's training step decides when to step
    loop = trainer.fit_loop.epoch_loop
    optimizer = loop.automatic_optimization.optim_progress.optimizer
    steps = optimizer.step.current.completed  # this epoch's, as the batch count is
    turns = _lane_turns(pipeline, state)
    begun = sum(turn > min(turns) for turn in turns) if turns else 0
    # the turns count the fit's steps, not the epoch's (it compared those: a later epoch's
    # mid-step state was left unaligned)
    done = optimizer.step.total.completed
    one_step = trainer.accumulate_grad_batches == len(turns) and done == min(turns)
    if begun and not one_step:  # mid-step: only where an optimizer step is one global step
        return
    progress = loop.batch_progress
    shift = steps * trainer.accumulate_grad_batches + begun - progress.current.ready
    if not shift:
        return
    # ready, started, processed and completed, total too; Lightning's increment_by also sets
    # is_last_batch, whose saved value (a save at an epoch's end) ends the resumed epoch
    progress.increment_by(shift, is_last_batch=progress.is_last_batch)


def _warn_if_mid_step(pipeline: Pipeline, state: dict[str, Any], accumulate: int) -> None:
    world_size = pipeline.topology[0]
    if world_size == 1:
        return
    turns = set(_lane_turns(pipeline, state))
    if len(turns) <= 1:
        return
    said = f"this checkpoint is taken mid-step (this rank's lanes are at turns {sorted(turns)}): "
    said += f"it resumes on {world_size} ranks or on one only. "
    lanes = len(pipeline.lanes)
    if accumulate % lanes == 0:  # at step ends but for Lightning's save at a resume
        said += (
            "ModelCheckpoint(every_n_train_steps=...) saves again after the first micro-batch "
            "of a resumed fit (accumulate_grad_batches > 1), under the name of the step-end "
            "checkpoint it resumed from: keep that one (another dirpath for the resumed fit) "
            "to resume on any world size"
        )
    else:
        said += (
            f"Checkpoint at step ends (accumulate_grad_batches={lanes} or a multiple of it: the "
            "lanes of a rank, canonical_replicas / world size) to resume on any world size"
        )
    warn(said)
