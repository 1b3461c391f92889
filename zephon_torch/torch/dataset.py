"""The pipeline as a torch ``IterableDataset``, split across DataLoader workers by lane.

A rank's lanes, rotated to start at the next lane due, are dealt to the DataLoader's workers
(worker w takes every a-th, a the number of workers used). Each worker emits its lanes in
(turn, lane) order, and the DataLoader's round robin over workers then reproduces the rank's
single-process order exactly. ``a`` is the largest divisor of the rank's lane count not above
``num_workers``; other workers stay idle (with a warning).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from zephon_torch._caller import warn
from zephon_torch._lanes import calibrated
from zephon_torch._packed_rows import pack_lanes
from zephon_torch._state import state_step, version_mismatch, version_note
from zephon_torch.errors import StateMismatchError, ZephonError, flag_setting
from zephon_torch.ops.training import HOST_FIELDS
from zephon_torch.torch._handover import Handover
from zephon_torch.torch._transport import pack
from zephon_torch.torch._warnings import WARNINGS_KEY, heard_warnings
from zephon_torch.torch.distributed import all_gather_lane_states, distributed_ready

if TYPE_CHECKING:
    from zephon_torch.ops.batch import Batch
    from zephon_torch.pipeline import Pipeline


def recipe_of(pipeline: Pipeline, estimation: Any) -> dict[str, Any]:
    """What ranks must agree on: a pipeline's fingerprint, its token estimation (which the
    lanes' mixing decisions rest on) and its micro-batch size (which their turns count)."""
    return {
        **pipeline.fingerprint(),
        "token estimation": estimation,
        "microbatch_size": pipeline._microbatch_size,
    }


META_KEY = "zephon"
ERROR_KEY = "zephon_error"
"""A worker's only item after it raised a zephon_torch error: the error itself. torch re-raises
a worker's exception as a RuntimeError when its class takes more than a message (DataError and
StorageError do), so `zephon_torch.torch.DataLoader` sends it as an item and raises it."""


def workers_used(*, num_lanes: int, num_workers: int) -> int:
    """How many of ``num_workers`` get lanes: the largest divisor of ``num_lanes`` <= workers."""
    if num_lanes == 0:
        return 1
    return max(d for d in range(1, min(num_lanes, max(1, num_workers)) + 1) if num_lanes % d == 0)


def idle_workers(*, num_lanes: int, num_workers: int) -> str | None:
    """The warning that some of ``num_workers`` DataLoader workers get no lane (None: all get
    lanes)."""
    used = workers_used(num_lanes=num_lanes, num_workers=num_workers)
    if used >= num_workers:
        return None
    return (
        f"{num_lanes} lanes on this rank cannot be split evenly over {num_workers} "
        f"DataLoader workers; using {used} of them (the rest stay idle). Pick a num_workers "
        "that divides the lanes per rank."
    )


def lanes_for_worker(
    *, lanes: list[int], turns: dict[int, int], num_workers: int, worker_id: int
) -> list[int]:
    """The lanes worker ``worker_id`` emits: the rank's lanes rotated to start at the next lane
    due (lowest turn, then lowest lane), dealt round robin over the workers used."""
    used = workers_used(num_lanes=len(lanes), num_workers=num_workers)
    if worker_id >= used:
        return []
    start = min(range(len(lanes)), key=lambda i: (turns.get(lanes[i], 0), i))
    rotated = lanes[start:] + lanes[:start]
    return rotated[worker_id::used]


class PipelineDataset(IterableDataset[dict[str, Any]]):
    """A ``Pipeline`` as an ``IterableDataset`` of training dicts.

    Use it in ``torch.utils.data.DataLoader(ds, batch_size=None, num_workers=N)`` or torchdata's
    ``StatefulDataLoader``. Each item is one lane's micro-batch as ``Batch.to_training()`` gives
    it. ``state_dict()`` describes what this process's iterator has yielded: exact with
    ``num_workers=0`` and inside StatefulDataLoader's workers. With a plain DataLoader and
    workers, use ``zephon_torch.torch.DataLoader``, which tracks delivered state in the main
    process and lets ``num_workers`` change between save and load. With workers under torch's
    loaders, every new pass (another ``for`` loop, the next epoch) starts where this dataset
    stands in the main process (its start, or the state loaded into it), since workers cannot
    tell it what they delivered (persistent workers too; a StatefulDataLoader's resumed pass
    goes on from its state): it repeats the data, and so does a StatefulDataLoader state
    saved after the stream ended (torchdata takes it as the start of the next pass). Use
    ``exhaustion="repeat"`` with a step budget (one pass that never ends) there, or
    ``zephon_torch.torch.DataLoader``, whose passes continue. Only that loader also keeps
    the one-process order at the end of a finite stream (``exhaustion="stop"``) with several
    workers: elsewhere a worker whose lanes are spent stops, and torch's round robin then
    regroups the remaining micro-batches (data and state stay exact; their order does not).
    Under Lightning use ``zephon_torch.lightning.PipelineDataModule``: a StatefulDataLoader's
    state there counts the batch Lightning fetched ahead, and only rank 0's is kept. Torch's
    default conversion turns numpy payloads (``pack_sequences``) into tensors; pass
    ``collate_fn`` an identity function defined at module level (workers pickle it) to keep
    them as stored, as ``zephon_torch.torch.DataLoader`` does.

    Args:
        pipeline: the recipe; its rank and world size resolve at iteration.
        mask_document_boundaries: passed to ``Batch.to_training``.
        attention_mask: passed to ``Batch.to_training``: a [B, 1, S, S] bool mask for
            ``scaled_dot_product_attention`` in every item (B*S*S bytes each).
    """

    def __init__(
        self,
        pipeline: Pipeline,
        *,
        mask_document_boundaries: bool = False,
        attention_mask: bool = False,
    ) -> None:
        super().__init__()
        # its own copy: iterating it (without workers) must not move the caller's pipeline,
        # nor another loader's; what is said where that is forgotten: `_handover`
        self.pipeline = pipeline._with()
        self._handover = Handover(pipeline)
        self.mask_document_boundaries = flag_setting(
            mask_document_boundaries, "`mask_document_boundaries`"
        )
        self.attention_mask = flag_setting(attention_mask, "`attention_mask`")
        self.with_meta = False  # set by zephon_torch.torch.DataLoader
        self.pack_transport = False  # likewise, with workers: one buffer per item
        self.endless = False  # likewise: spent lanes pad on, the loader ends the stream
        self._loaded: dict[str, Any] | None = None
        self._delivered: dict[str, Any] = {}
        self._worker_lanes: list[int] | None = None
        # in a DataLoader worker: the dataset as it reached the worker, and the passes begun
        self._arrived: tuple[Any, ...] | None = None
        self._worker_passes = 0
        self._idle_note: str | None = None  # a worker's warning that some workers are idle
        self._warned_rank_state = False  # that a state holds one rank's lanes (no gather)
        if any(s is not None for s in pipeline._lane_states.values()):
            # the pipeline was iterated or loaded: continue from there
            self._load(pipeline._state_dict())

    def __getstate__(self) -> dict[str, Any]:
        """Pickled for a spawned DataLoader worker: the rank's lanes are resolved here, in the
        process that has the process group. A spawned worker has none, and where the group was
        set up without RANK/WORLD_SIZE in the environment (``torch.multiprocessing.spawn``), it
        would take itself for rank 0 of 1 and read other ranks' lanes."""
        state = self.__dict__.copy()
        if self.pipeline._lane_subset is None:
            state["pipeline"] = self.pipeline.with_lanes(self.pipeline.lanes)
        return state

    def __copy__(self) -> PipelineDataset:
        """A plain shallow copy: the rank's lanes still resolve when it is iterated."""
        clone = PipelineDataset.__new__(PipelineDataset)
        clone.__dict__.update(self.__dict__)
        clone._handover = copy.copy(self._handover)
        return clone

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self._handover.check()
        info = get_worker_info()
        if info is not None:
            # here, not at the first item: StatefulDataLoader takes a worker's state as soon
            # as its pass begins
            self._begin_worker_pass()
            if info.num_workers > 1:
                self._worker_lanes = self._split_over_workers(info.num_workers, info.id)
        return self._items()

    def _begin_worker_pass(self) -> None:
        """In a DataLoader worker, a pass after its first (persistent workers) starts where
        the dataset stood when it reached the worker, as a fresh worker's pass does: not from
        what this worker produced (its own lanes only, and what it prefetched)."""
        if self._arrived is None:  # or taken by a load_state_dict before the first pass
            self._arrived = self._as_arrived()
        elif self._worker_passes:
            loaded, delivered, estimation = copy.deepcopy(self._arrived)
            self._loaded, self._delivered = loaded, delivered
            self.pipeline._estimation = estimation
        self._worker_passes += 1

    def _as_arrived(self) -> tuple[Any, ...]:
        return copy.deepcopy((self._loaded, self._delivered, self.pipeline._estimation))

    def _split_over_workers(self, num_workers: int, worker_id: int) -> list[int]:
        """The lanes this DataLoader worker emits (see the module docstring)."""
        rank_lanes = self.pipeline.lanes
        note = idle_workers(num_lanes=len(rank_lanes), num_workers=num_workers)
        if note is not None and worker_id == 0 and not self.with_meta:
            # a torch loader's: given as the worker's items begin (zephon_torch's loader
            # warns in the main process, at the user's line)
            self._idle_note = note
        if self._loaded is not None and "worker_lanes" in self._loaded:
            # A worker's own state (StatefulDataLoader): same workers, same lanes.
            return list(self._loaded["worker_lanes"])
        states = self.resume_lanes(self._delivered)
        turns = {int(k): v["turn"] for k, v in states.items() if v is not None}
        return lanes_for_worker(
            lanes=rank_lanes, turns=turns, num_workers=num_workers, worker_id=worker_id
        )

    def _items(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        pipeline = self.pipeline
        resuming = self._loaded is not None or bool(self._delivered)
        states = self.resume_lanes(self._delivered) if resuming else {}
        if info is not None and info.num_workers > 1:
            mine = list(self._worker_lanes or [])
            if not mine:
                return
        else:
            mine = pipeline.lanes
            if info is None:  # figures for the states; workers get them with the dataset
                calibrated(pipeline)
        # a copy per iteration, from what was delivered: loaders sharing the dataset, and
        # iterators of one loader, never move each other
        # in a worker of zephon_torch's loader, which warns of a spent state in the main process
        quiet = self.with_meta and info is not None
        # and gives the warnings its workers heard there, once (see `_warnings`)
        with heard_warnings(quiet) as heard:
            if self._idle_note is not None:
                warn(self._idle_note)
                self._idle_note = None
            pipeline = pipeline.with_lanes(mine, endless=self.endless, quiet=quiet)
            if states:
                state = pipeline.state_dict()
                state["lanes"] = {str(lane): states.get(str(lane)) for lane in pipeline.lanes}
                state["step"] = state_step(state["lanes"])
                if self._loaded is not None and self._loaded.get("estimation") is not None:
                    state["estimation"] = self._loaded["estimation"]
                pipeline._load_state(state)  # warned of mid-step in the main process
            by_documents = pipeline._source.mixing == "documents"  # for the loader's stats
            # a torch loader's batches reach the loop here without workers (the library's
            # loader tells the pipeline made from itself, in `_strip`)
            handed = info is not None or self.with_meta
            try:
                for batch in pipeline:
                    if not handed:
                        self._handover.delivered("dataset")
                        handed = True
                    self._delivered[str(batch.lane)] = batch.state
                    item = self._item(batch, by_documents=by_documents)
                    if heard:
                        item[WARNINGS_KEY] = heard.take()
                    yield pack(item) if self.pack_transport and info is not None else item
                # a stream the pipeline cut itself (not endless): its lanes' final states, spent
                # (see `_turn_order.spent_at`), so ranks' final states merge
                for lane, final in pipeline._lane_states.items():
                    self._delivered[str(lane)] = final
            except ZephonError as error:
                if info is None or not self.with_meta:
                    raise
                yield {ERROR_KEY: error, WARNINGS_KEY: heard.take() if heard else []}

    def _item(self, batch: Batch, *, by_documents: bool) -> dict[str, Any]:
        """A batch's training dict, with its payloads, and, for zephon_torch's loader, what
        it needs of the batch besides (``META_KEY``: lane, turn, state, counts for stats)."""
        item: dict[str, Any] = dict(
            batch.to_training(
                mask_document_boundaries=self.mask_document_boundaries,
                attention_mask=self.attention_mask,
            )
        )
        if batch.payloads is not None:
            item["payloads"] = batch.payloads
        if self.with_meta:
            item[META_KEY] = {
                "lane": batch.lane,
                "turn": batch.turn,
                "tokens": batch.num_tokens,
                "state": batch.state,
                "sources": batch.tokens_by_source(),
                "documents": batch.documents_by_source() if by_documents else {},
            }
        return item

    def state_dict(self) -> dict[str, Any]:
        """The state after what this process's iterator yielded (see the class docstring).

        Inside a DataLoader worker it holds that worker's lanes only, and ``"worker_lanes"``,
        so StatefulDataLoader can hand each worker back its own state (same ``num_workers``).
        """
        state = self.pipeline_state(self._delivered)
        if get_worker_info() is not None and self._worker_lanes is not None:
            state["lanes"] = {
                str(lane): state["lanes"].get(str(lane)) for lane in self._worker_lanes
            }
            state["worker_lanes"] = list(self._worker_lanes)
            state["step"] = state_step(state["lanes"])
        return state

    def resume_lanes(self, delivered: dict[str, Any]) -> dict[str, Any]:
        """This rank's lane states to continue from: loaded, then updated by ``delivered``."""
        states = dict(self._loaded["lanes"]) if self._loaded is not None else {}
        states.update(delivered)
        return {str(lane): states.get(str(lane)) for lane in self.pipeline.lanes}

    def pipeline_state(self, delivered: dict[str, Any]) -> dict[str, Any]:
        """A full pipeline state for this rank from per-lane delivered states; gathered over
        ranks when ``torch.distributed`` is initialised (then a collective)."""
        base = self.pipeline.state_dict()
        # not base["lanes"]: without workers the pipeline's own states are what it produced;
        # and only this rank's lanes: the others' loaded states went on on their own ranks,
        # whose gathered states must not be overwritten by these. A copy: the caller owns
        # what it gets, and the loaded state is what a later iteration resumes from (lanes
        # not delivered since the load come from it)
        lanes = pack_lanes(copy.deepcopy(self.resume_lanes(delivered)))
        if get_worker_info() is None and distributed_ready():
            recipe = recipe_of(self.pipeline, base.get("estimation"))
            lanes = all_gather_lane_states(lanes, recipe, self.pipeline.topology)
        elif get_worker_info() is None and self.pipeline.topology[0] > 1:
            self._warn_rank_state(len(lanes))
        base["lanes"] = lanes
        # a worker left idle (StatefulDataLoader) holds no lanes
        base["step"] = state_step(lanes)
        return base

    def _warn_rank_state(self, held: int) -> None:
        """Warn, once, that a state of a rank of several, with no process group to gather
        over, holds that rank's lanes only: saved from rank 0 alone, as a checkpoint is, the
        run could not resume."""
        if self._warned_rank_state:
            return
        self._warned_rank_state = True
        world_size, rank = self.pipeline.topology
        warn(
            f"state_dict() holds rank {rank}'s lanes only ({held} of "
            f"{self.pipeline._options.canonical_replicas}): the world size is {world_size} "
            "but no torch.distributed process group is initialised to gather the other "
            "ranks' over. Initialise one (torch.distributed.init_process_group) before "
            "iterating, or save every rank's state and merge them with "
            "zephon_torch.merge_states"
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a state of any world size dividing L; checked against the recipe,
        warned of where saved mid-step."""
        state = self._load(state)
        self._handover.own_state()
        if "worker_lanes" not in state and get_worker_info() is None:
            self.pipeline._warn_mid_step(state["lanes"])

    def _load(self, state: dict[str, Any]) -> dict[str, Any]:
        """Loads ``state``; returns it with its turns in this pipeline's micro-batches (see
        ``_regroup``)."""
        from zephon_torch._state import check_shape, loaded_state

        check_shape(state)
        mismatch = version_mismatch(state)
        if mismatch:
            raise StateMismatchError(mismatch, note=version_note(state["version"]))

        # a worker's own state (StatefulDataLoader) holds its lanes; any other, this rank's
        if "worker_lanes" in state and get_worker_info() is None:
            # outside that worker its lanes would go to every worker, or to none
            raise StateMismatchError(
                {
                    "worker_lanes": (
                        state["worker_lanes"],
                        "the state of a whole loader or pipeline: this is one DataLoader "
                        "worker's (its `dataset_state` inside a StatefulDataLoader state); "
                        "load the StatefulDataLoader's own state_dict, or the loader's",
                    )
                }
            )
        needed = state.get("worker_lanes", self.pipeline.lanes)
        assert self.pipeline._microbatch_size is not None
        size = self.pipeline._microbatch_size
        state = loaded_state(state, size, self.pipeline.fingerprint(), needed)
        if "worker_lanes" not in state:
            self.pipeline._check_in_step(state["lanes"])
        if get_worker_info() is not None and self._arrived is None:
            # StatefulDataLoader's resume, before the worker's first pass: that pass goes
            # on from the state, and later ones start over as fresh workers' would
            self._arrived = self._as_arrived()
        self._loaded = copy.deepcopy(state)
        self._delivered = {}
        if state.get("estimation") is not None:  # frozen: a resume never re-measures
            self.pipeline._estimation = copy.deepcopy(state["estimation"])
        return state


def to_device(item: dict[str, Any], device: torch.device | str) -> dict[str, Any]:
    """Move a training dict's tensors to ``device``, non-blocking (pin the memory first, e.g.
    with ``pin_memory=True`` in the DataLoader, for a truly asynchronous copy).

    ``max_seqlen`` stays where it is (on the CPU): attention kernels take it as an ``int``, and
    ``int()`` of a GPU tensor waits for the GPU, in every layer that reads it.
    """
    return {
        k: v.to(device, non_blocking=True)
        if isinstance(v, torch.Tensor) and k not in HOST_FIELDS
        else v
        for k, v in item.items()
    }
