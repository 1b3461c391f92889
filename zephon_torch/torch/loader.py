"""A torch DataLoader that records, in the main process, what the training loop received.

Workers attach each micro-batch's lane state to it; the loader strips it off as it hands the
batch over and keeps the latest state per lane. So ``state_dict()`` between batches is exactly
what was delivered (never what workers prefetched), and since the state is per lane, not per
worker, ``num_workers`` may change between save and load.
"""

from __future__ import annotations

import copy
import multiprocessing
import pickle
import time
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch.utils.data

from zephon_torch._caller import warn
from zephon_torch._lane_warnings import warn_if_spent
from zephon_torch._lanes import calibrated
from zephon_torch._stats import RunCounters, loader_stats
from zephon_torch._turn_order import (
    cut_at_empty_turn,
    in_lane_order,
    skip_spent_turns,
    spent_at,
)
from zephon_torch.errors import ConfigError, cannot_pickle
from zephon_torch.ops._spawn_main import check_main
from zephon_torch.torch._arguments import checked_context, checked_workers, refuse_torch_arguments
from zephon_torch.torch._signals import leaving_signals
from zephon_torch.torch._transport import unpack
from zephon_torch.torch._warnings import WARNINGS_KEY, give
from zephon_torch.torch.dataset import (
    ERROR_KEY,
    META_KEY,
    PipelineDataset,
    idle_workers,
    recipe_of,
)
from zephon_torch.torch.distributed import check_data_parallel, collective, equal_ending

if TYPE_CHECKING:
    from zephon_torch.pipeline import Pipeline


class DataLoader(torch.utils.data.DataLoader[dict[str, Any]]):
    """``torch.utils.data.DataLoader`` over a pipeline, with exact ``state_dict``.

    Args:
        data: a ``Pipeline`` or its ``PipelineDataset`` (the loader works on its own copy
            of the dataset, from the dataset's state now: load later states through the
            loader).
        num_workers: DataLoader worker processes; a performance knob (never changes data).
        pin_memory: pin batches for asynchronous host-to-device copies.
        prefetch_factor: batches each worker prepares ahead (ignored without workers).
        multiprocessing_context: e.g. ``"spawn"``; the default (fork on Linux) works too.
        timeout: seconds to wait for a worker's batch (0: forever; ignored without workers).
        worker_init_fn: called with the worker's id in each worker as it starts, before it
            reads (seeding the user's own libraries, say); it cannot change the data, which
            depends on the pipeline's seed alone (ignored without workers).
        persistent_workers: accepted for torch's signature; only False (True is refused: a
            persistent worker would resume from what it produced, not from what the loop
            received).
        deliver_on_use: for loops that fetch batches ahead of using them (Lightning does): each
            batch keeps its ``"zephon"`` entry, and only ``mark_delivered(batch)``, called when
            the batch is actually used, advances the state (a lane's batch marked after a
            later one of the same lane does not move it back).
        restart: every ``iter()`` starts where the loader started (the pipeline's beginning,
            or the state loaded last), not where the previous pass stopped: an evaluation
            loader that shows the same batches at each run.

    ``state_dict()`` is a collective under ``torch.distributed``: call it on every rank, between
    global steps (a state saved mid-step continues only on its own world size, and on one
    process). With
    ``exhaustion="stop"`` on several ranks, every rank ends on the same step: a rank whose lanes
    are spent yields all-padding micro-batches (``num_valid_tokens == 0``) until no rank has
    data, agreed by one small all-reduce per step. Persistent workers are refused: they would
    keep producing from a stale state. Only the newest iterator runs: one made before a later
    ``iter(loader)`` or ``load_state_dict`` raises RuntimeError on its next call.
    """

    def __init__(
        self,
        data: Pipeline | PipelineDataset,
        *,
        num_workers: int = 0,
        pin_memory: bool = False,
        prefetch_factor: int | None = None,
        multiprocessing_context: str | None = None,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        persistent_workers: bool = False,
        deliver_on_use: bool = False,
        restart: bool = False,
        **others: Any,
    ) -> None:
        from zephon_torch.pipeline import Pipeline

        refuse_torch_arguments(others)

        if not isinstance(data, (Pipeline, PipelineDataset)):
            raise ConfigError(
                f"`DataLoader` loads a Pipeline or its `to_torch()` dataset, got {data!r}"
            )
        for name, flag in (("deliver_on_use", deliver_on_use), ("restart", restart)):
            if not isinstance(flag, bool):
                raise ConfigError(f"`{name}` must be True or False, got {flag!r}")
        num_workers, prefetch_factor = checked_workers(num_workers, prefetch_factor)
        checked_context(multiprocessing_context)
        if persistent_workers:
            raise ConfigError(
                "`persistent_workers=True` is not supported: a persistent worker would resume "
                "from what it produced, not from what the loop received"
            )
        # its own copy: the flags set per iteration below (metadata, packed transport) must
        # not reach another loader, a plain torch one too, iterating the caller's dataset
        dataset = copy.copy(data) if isinstance(data, PipelineDataset) else data.to_torch()
        super().__init__(
            dataset,
            batch_size=None,
            collate_fn=_as_is,  # items are tensors already; payloads pass untouched
            num_workers=num_workers,
            pin_memory=pin_memory,
            # Meaningless without workers; accepted so a worker count can be set to 0 alone.
            prefetch_factor=prefetch_factor if num_workers else None,
            multiprocessing_context=multiprocessing_context if num_workers else None,
            timeout=timeout if num_workers else 0,
            worker_init_fn=worker_init_fn,
        )
        # from what the dataset delivered so far: a dataset iterated before continues
        given = data._delivered if isinstance(data, PipelineDataset) else {}
        self._delivered: dict[str, Any] = copy.deepcopy(given)
        self.restart = restart
        self._start = copy.deepcopy(given)  # where each pass starts (`restart`)
        self._generation = 0  # counts iter() and load_state_dict(): older iterators are stale
        self.deliver_on_use = deliver_on_use
        self._pack_transport = True  # off only to measure torch's own transport
        self._idle_warned = False  # the idle-workers warning is given once per loader
        # spent lanes pad on and the stream never ends: the caller cuts it (verify's
        # simulated ranks, which end together where no rank has data)
        self._pad_on = False
        self._counters = RunCounters()  # of the newest iteration (`stats`)
        self._live: weakref.ref[Any] | None = None  # torch's iterator of the newest iteration
        # (lane, turn) of the batches handed out and not yet marked (``deliver_on_use``), and
        # the final states kept until they are: see `_ended`
        self._unmarked: set[tuple[int, int]] = set()
        self._end: list[tuple[str, dict[str, Any]]] = []

    @property
    def pipeline_dataset(self) -> PipelineDataset:
        """The dataset this loader iterates."""
        dataset = self.dataset
        assert isinstance(dataset, PipelineDataset)
        return dataset

    def __len__(self) -> int:
        """Not sized: a stream (a TypeError, as for any loader of an IterableDataset, which
        Lightning takes for a stream of unknown length), saying how to bound a run."""
        raise TypeError(
            "zephon_torch.torch.DataLoader streams micro-batches and has no length: bound the "
            "run by steps (a step budget in your loop, Trainer(max_steps=...)), or use "
            "exhaustion='stop' to end where the data ends"
        )

    def __iter__(self) -> Iterator[dict[str, Any]]:  # type: ignore[override]
        # Workers are started from the dataset as it is now: continue from what was delivered.
        dataset = self.pipeline_dataset
        # Set per iteration (workers copy the dataset when they start): another loader may
        # share this dataset. A worker, or a rank of several, sees only some of the lanes, so
        # it must not end the stream itself: spent lanes pad on (with their states), workers'
        # items are put back in (turn, lane) order, and the stream is cut here, where one
        # process would end it (across ranks: at the first turn no rank has data).
        pipeline = dataset.pipeline
        dataset._handover.check()  # here, not in a worker: the error at the user's line
        if self.restart:
            self._delivered = copy.deepcopy(self._start)
        calibrated(pipeline)  # once, here: workers start with the figures, and states hold them
        # of the lanes this rank holds now (a process group made after the loader changes them)
        note = idle_workers(num_lanes=len(pipeline.lanes), num_workers=self.num_workers)
        if note is not None and not self._idle_warned:
            self._idle_warned = True
            warn(note)
        ranks = collective(pipeline.topology)
        # every rank's topology and recipe, at step 0 (the group made here)
        recipe = recipe_of(pipeline, pipeline._estimation)
        check_data_parallel(pipeline.topology, recipe)
        begun = self._in_step() if ranks else 0
        equalise = ranks and pipeline.exhaustion == "stop"
        # never cut under "repeat" (see Pipeline.__iter__): a rank dealt no document pads
        uncut = equalise or self._pad_on or pipeline.exhaustion == "repeat"
        dataset.with_meta = True
        dataset.pack_transport = self.num_workers > 0 and self._pack_transport
        # the stream is cut here with any worker count: the empty turn's states (every lane
        # spent) are the lanes' final ones, so ranks' final states merge
        dataset.endless = True
        lanes = dataset.resume_lanes(self._delivered)
        resumed = any(s is not None for s in lanes.values())
        if not uncut:  # a spent state's lanes far behind pad nothing (see `skip_spent_turns`)
            moved = skip_spent_turns(lanes)
            self._delivered.update({k: v for k, v in moved.items() if v is not lanes[k]})
        dataset._delivered = copy.deepcopy(self._delivered)
        self._end_live()
        self._generation += 1
        self._counters = RunCounters(count_documents=pipeline._source.mixing == "documents")
        self._unmarked, self._end = set(), []
        torch_items = self._started_workers()
        self._live = weakref.ref(torch_items)
        items: Iterator[dict[str, Any]] = _raising(map(unpack, torch_items))
        turns = self._lane_turns()
        if self.num_workers > 1:
            items = in_lane_order(items, key=_turn_and_lane, turns=turns)
        if not uncut:
            ahead = max(turns.values())
            items = cut_at_empty_turn(
                items, turn=_turn, tokens=_tokens, ahead=ahead, ended=self._ended
            )
        if equalise:
            per_turn = len(pipeline.lanes)
            # the empty turn's states (every lane spent) are the final ones, as in one process
            items = equal_ending(
                items, lanes_per_turn=per_turn, tokens=_tokens, begun=begun, ended=self._ended
            )
        return self._strip(items, self._generation, self._counters, resumed=resumed)

    def _started_workers(self) -> Iterator[Any]:
        """torch's iterator, whose workers (if any) start here, leaving the job's Ctrl-C and
        SIGTERM to this process (`_signals`); a pipeline that a worker started by spawn or
        forkserver cannot receive (a lambda, a closure; a function of a `python -c` command,
        `check_main`) is a ConfigError saying so, not a bare error."""
        workers = "DataLoader workers"
        if self.num_workers > 0:  # chosen here, as torch does: the default may be set late
            self.multiprocessing_context = leaving_signals(self.multiprocessing_context)
            # only with workers: asking the default context its method fixes it, and a later
            # `multiprocessing.set_start_method` (after a loop of no workers) was refused
            context = self.multiprocessing_context or multiprocessing.get_context()
            method = context.get_start_method()
            workers = f"DataLoader workers started by {method!r}"
            if method != "fork":
                check_main(self.pipeline_dataset, what=f"the {workers}", instead="use 'fork'")
        try:
            return super().__iter__()
        except (pickle.PicklingError, AttributeError, TypeError) as error:
            if not cannot_pickle(error):
                raise
            raise ConfigError(
                f"{workers} get the pipeline pickled, and it holds what cannot be (use "
                "module-level functions, not lambdas or closures, in map, filter and the rest; "
                f"or fork): {error}"
            ) from error

    def _lane_turns(self) -> dict[int, int]:
        """The turn each of this rank's lanes resumes at (0 for a lane not started)."""
        lanes = self.pipeline_dataset.resume_lanes(self._delivered)
        return {int(lane): 0 if state is None else state["turn"] for lane, state in lanes.items()}

    def _in_step(self) -> int:
        """Refuse a state just loaded that would put the ranks at different turns (the
        pipeline's rule: a state of this rank's lanes only is not compared across ranks; the
        rank's own progress keeps them in step). Checked again here: a state loaded before
        the process group was set up was checked as one rank's. Returns how many of this
        rank's lanes are a turn ahead of its others: those of a step it stopped in."""
        loaded = self.pipeline_dataset._loaded
        if loaded is not None and not self._delivered:
            self.pipeline_dataset.pipeline._check_in_step(loaded["lanes"])
        turns = list(self._lane_turns().values())
        return sum(turn > min(turns) for turn in turns)

    def _strip(
        self,
        items: Iterator[dict[str, Any]],
        generation: int,
        counters: RunCounters,
        *,
        resumed: bool,
    ) -> Iterator[dict[str, Any]]:
        delivered = 0
        counting = self.pipeline_dataset.pipeline._options.stats
        try:
            while True:
                if self._generation != generation:
                    raise RuntimeError(
                        "this iterator of the loader is stale: the loader was iterated again "
                        "or loaded a state since it was made; use the newest iter(loader)"
                    )
                start = time.perf_counter()
                item = next(items, None)
                if item is None:
                    warn_if_spent(resumed, delivered)
                    return
                if not delivered:  # the pipeline it was made from stays behind
                    self.pipeline_dataset._handover.delivered("loader")
                delivered += 1
                meta = item[META_KEY]
                if counting:
                    waited = time.perf_counter() - start
                    shape = item["input_ids"].shape
                    counters.received(shape, meta["sources"], meta["documents"], waited)
                if not self.deliver_on_use:
                    self.mark_delivered(item)
                else:
                    self._unmarked.add((int(meta["lane"]), int(meta["turn"])))
                yield item
        except Exception:
            # a worker's error ended its stream: stop the iteration's workers now, not once
            # the error (whose frames hold torch's iterator) is collected
            if self._generation == generation:
                self._end_live()
            raise
        finally:  # ran out, raised, or left (a break): its stats stay as they were
            counters.ended = time.perf_counter()

    def _ended(self, empty_turn: list[dict[str, Any]]) -> None:
        """Keep the states of the all-padding turn that ended the stream (not handed to the
        loop): each lane spent, its final state. Recorded once every batch handed out is
        marked (``deliver_on_use``: the loop may still hold some)."""
        self._end = [(str(i[META_KEY]["lane"]), spent_at(i[META_KEY]["state"])) for i in empty_turn]
        if not self._unmarked:
            self._record_end()

    def mark_delivered(self, item: dict[str, Any]) -> None:
        """Record ``item`` as used by the training loop (removes its ``"zephon"`` entry)."""
        meta = item.pop(META_KEY, None)
        if meta is None:  # an item marked twice changes nothing
            return
        self._record(str(meta["lane"]), meta["state"])
        # this lane's batches up to this one count as used (a batch never marked stays
        # behind a later one of its lane, as its state does)
        lane, turn = int(meta["lane"]), int(meta["turn"])
        self._unmarked = {(n, t) for n, t in self._unmarked if n != lane or t > turn}
        if self._end and not self._unmarked:
            self._record_end()

    def _record(self, lane: str, state: dict[str, Any]) -> None:
        held = self._delivered.get(lane)
        # a lane's batch marked after a later one of the same lane must not move it back
        if held is None or state["turn"] >= held["turn"]:
            self._delivered[lane] = state

    def _record_end(self) -> None:
        for lane, state in self._end:
            self._record(lane, state)
        self._end = []

    def stats(self) -> dict[str, Any]:
        """What the loop received from the current (or last) iteration, counted in the
        loop's process: batches, tokens and tokens/s, delivered shares against targets,
        padding fraction, documents skipped by policy (from the run's start, as
        ``Pipeline.stats``), the time the loop waited for batches (``stalls``) and this rank's
        state size. Per-operator timings and the packers' waits are measured in the workers
        (``options(stats_every=..., on_stats=...)`` reports them there): None here. Not a
        collective: under ``torch.distributed`` each rank reports its own lanes."""
        lanes = self.pipeline_dataset.resume_lanes(self._delivered)
        return loader_stats(self.pipeline_dataset.pipeline, self._counters, lanes)

    def state_dict(self) -> dict[str, Any]:
        """The pipeline state after the last batch handed to the loop (global under
        ``torch.distributed``)."""
        return self.pipeline_dataset.pipeline_state(self._delivered)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` at the next ``iter()``; any W dividing L, any workers (a
        state saved mid-step: only its own W, or one process)."""
        self.pipeline_dataset.load_state_dict(state)
        self._delivered, self._start = {}, {}
        self._generation += 1
        self._end_live()

    def _end_live(self) -> None:
        """Stop the workers (or, without workers, the pipeline's threads) of the iteration a
        newer ``iter()`` or ``load_state_dict`` made stale, even where the caller still holds
        its iterator: it raises on its next call, and would read ahead until collected."""
        live = self._live() if self._live is not None else None
        self._live = None
        if live is None:
            return
        # torch's iterators: no public way to end one; guarded, for torch versions without
        shutdown = getattr(live, "_shutdown_workers", None)  # worker processes
        if shutdown is not None:
            shutdown()
            return
        inner = getattr(getattr(live, "_dataset_fetcher", None), "dataset_iter", None)
        close = getattr(inner, "close", None)  # the dataset's generator, in this process
        if close is not None:
            close()


def _raising(items: Iterator[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The items, raising a worker's error where it sent one (see `ERROR_KEY`), and giving the
    warnings its workers heard (see `_warnings`), each of those given once an iteration once."""
    given: set[tuple[str, ...]] = set()
    for item in items:
        heard = item.pop(WARNINGS_KEY, None)
        if heard:
            give(heard, given)
        if ERROR_KEY in item:
            raise item[ERROR_KEY]
        yield item


def _as_is(item: Any) -> Any:
    return item


def _turn(item: dict[str, Any]) -> int:
    return int(item[META_KEY]["turn"])


def _turn_and_lane(item: dict[str, Any]) -> tuple[int, int]:
    return int(item[META_KEY]["turn"]), int(item[META_KEY]["lane"])


def _tokens(item: dict[str, Any]) -> int:
    return int(item[META_KEY]["tokens"])
