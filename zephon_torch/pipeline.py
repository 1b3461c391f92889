"""The pipeline: a recipe built step by step, its fingerprint, and its delivered state.

Per lane it runs one reader per source (fetch, maps, filters, tokenize on a shared pool)
feeding a serial mix+pack node feeding a batch node (wired by ``_lanes.LaneRuntime``). The rank
emits one micro-batch per owned lane per turn, in lane order. The state is what was delivered:
the lane state carried by the last batch each lane handed over.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

from zephon_torch._caller import warn
from zephon_torch._lane_split import MID_STEP, step_remainder
from zephon_torch._lanes import LaneRuntime, deliver, stop_iteration
from zephon_torch._packed_rows import pack_lanes
from zephon_torch._recipe import recipe_fingerprint
from zephon_torch._specs import (
    BadRows,
    Options,
    PackSpec,
    PretokenizedSpec,
    TokenizeSpec,
)
from zephon_torch._state import STATE_VERSION, loaded_state, state_step
from zephon_torch._stats import RunCounters, pipeline_stats
from zephon_torch._steps import RecipeSteps
from zephon_torch._token_stage import pad_id, prefetch_depth
from zephon_torch.elastic import check_in_step, lanes_for_rank
from zephon_torch.errors import ConfigError
from zephon_torch.ops._tokenizer import ResolvedTokenizer, fork_safe_backend
from zephon_torch.ops.batch import Batch
from zephon_torch.ops.filter import FilterOp
from zephon_torch.ops.map import MapOp
from zephon_torch.ops.prefetch import Prefetcher
from zephon_torch.ops.stateful import StatefulFilter
from zephon_torch.torch.distributed import resolve_topology, world_size_name
from zephon_torch.work.mixture import StaticMixtureWorkSource

if TYPE_CHECKING:
    from zephon_torch._token_stage import ReadDatasets
    from zephon_torch.torch.dataset import PipelineDataset

# an iteration's live parts: threads, never copied into a new pipeline or a spawned worker
_LIVE_FIELDS = ("_live", "_live_runtime", "_runtime", "_handed")


class Pipeline(RecipeSteps):
    """A recipe (work source plus operators) and the stream it produces for this rank.

    Builder methods return a new ``Pipeline``; iterate it for ``Batch`` objects (one per owned
    lane per turn). Iteration continues from the delivered state: the start, a loaded state, or
    where the previous iteration stopped.

    Args:
        source: the work source (datasets, mixture, seed).
    """

    def __init__(self, source: StaticMixtureWorkSource) -> None:
        if not isinstance(source, StaticMixtureWorkSource):
            raise ConfigError(
                f"`source` must be a StaticMixtureWorkSource, got {type(source).__name__}"
            )
        self._source = source
        self._options = Options()
        self._datasets = source.datasets  # as read: with `options(io_options=)` applied
        # those datasets reading only the fields read (`read_datasets`), and what for
        self._read_datasets: ReadDatasets | None = None
        self._user_ops: tuple[MapOp | FilterOp, ...] = ()
        self._tokenize: TokenizeSpec | None = None
        self._pretokenized: PretokenizedSpec | None = None
        self._pack: PackSpec | None = None
        self._microbatch_size: int | None = None
        self._shuffle_window: int | None = None
        self._stateful: tuple[tuple[Callable[[int], StatefulFilter], str], ...] = ()
        self._lane_states: dict[int, dict[str, Any] | None] = {}
        self._lane_subset: tuple[int, ...] | None = None
        self._endless = False  # a DataLoader worker's part: padding after its lanes are spent
        self._quiet_spent = False  # a worker whose loader warns of a spent state itself
        self._estimation: dict[str, dict[str, float]] | None = None
        self._resolved: dict[str, ResolvedTokenizer] = {}
        self._live: Prefetcher[Batch] | None = None
        self._live_runtime: LaneRuntime | None = None  # the newest iterator's, until it ends
        self._runtime: LaneRuntime | None = None
        self._counters = RunCounters()
        self._iteration = 0  # counts iter() and load_state_dict(): an older iterator is stale
        # states loaded, and why state_dict() is not the loop's (see `torch._handover`)
        self._loads = 0
        self._handed: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        # A live iteration (threads) stays behind: a copy sent to a worker starts from the state.
        return {**self.__dict__, **dict.fromkeys(_LIVE_FIELDS)}

    # -- builder -------------------------------------------------------------------------------
    # (the steps, `map` to `batch`, are in ``_steps.RecipeSteps``)

    def _with(self, **changes: Any) -> Pipeline:
        new = copy.copy(self)
        new._lane_states = {}
        for name in _LIVE_FIELDS:
            setattr(new, name, None)
        new._counters = RunCounters()
        for key, value in changes.items():
            setattr(new, key, value)
        return new

    def options(
        self,
        *,
        canonical_replicas: int | None = None,
        world_size: int | None = None,
        rank: int | None = None,
        prefetch: int | Literal["auto"] | None = None,
        read_ahead: int | None = None,
        stats_every: int | None = None,
        on_stats: Callable[[dict[str, Any]], None] | None = None,
        stats: bool | None = None,
        io_options: Mapping[str, Any] | None = None,
        bad_rows: BadRows | None = None,
    ) -> Pipeline:
        """Lanes, topology and performance settings (``canonical_replicas`` is data-affecting;
        the rest are not).

        Args:
            canonical_replicas: L, the number of lanes; the largest GPU count you plan to use
                (default 1, which runs on one rank only).
            world_size: W, the number of ranks; must divide L. Default: from
                ``torch.distributed`` when initialised, else ``WORLD_SIZE``, else 1. Given
                where those are set, and other than theirs, it is a data-parallel world inside
                them (tensor, pipeline or context parallel replicas share a rank): it must
                divide theirs, with ``rank`` given too; 1 makes a loader of this process alone.
            rank: this rank, in ``[0, W)``; default as for ``world_size``. Given with the
                process group's own ``world_size``, it must be the process group's rank.
            prefetch: micro-batches computed ahead on a background thread (0: as the consumer
                asks). ``"auto"`` (the default): none for pre-tokenized data (packing stored
                ids holds the GIL, so the thread could not overlap it, and handing micro-batches
                over cost more than half of making them), else 8.
            read_ahead: chunks of documents each reader keeps in flight (default 4): the
                reader of a source of under a quarter of the mixture keeps fewer, in
                proportion, and at least one.
            stats_every: call ``on_stats(pipeline.stats())`` every this many micro-batches;
                0 turns a hook set before off.
            on_stats: the periodic stats hook (e.g. a logger).
            stats: keep the per-batch counters of ``stats()`` (default True; False leaves
                its batch, token and stall figures at zero, for measuring their cost).
            io_options: shard-cache, retry, Parquet and MDS settings for every dataset
                this pipeline reads, as for ``Dataset.from_path`` (``{"cache": {"dir",
                "max_bytes", "prefetch_bytes", "prefetch_threads", "enabled"}, "retry":
                {...}, "parquet": {"row_group_cache_bytes"}, "mds": {"verify_hashes"}}``);
                the keys given replace the dataset's own (and earlier calls'), the rest are
                kept. Local datasets take only ``parquet`` and ``mds`` (and compressed JSONL
                ``cache``).
            bad_rows: ``"raise"`` (the default): a row whose reading, ``map``, ``filter``,
                chat template or tokenizing raises a ``DataError`` naming it (malformed JSON, a
                missing or mistyped field, text that is not UTF-8, an exception of your
                function on it) ends the run with that error. ``"skip"``: the row gives no
                tokens and is counted in ``stats()["skipped_documents"]["malformed"]``, with a
                warning naming the first one per dataset; the same rows are skipped at every
                world size, worker count and resume; a lane whose first 100 rows of a dataset
                are all malformed raises (a misspelt field, not bad rows). Errors
                that are no row's own (a corrupt,
                unreadable or changed shard, storage errors) and stored ids outside the
                vocabulary still raise. Not data-affecting: a run stopped by a bad row resumes
                from its last state with ``"skip"``.
        """
        given: dict[str, Any] = {
            "canonical_replicas": canonical_replicas,
            "world_size": world_size,
            "rank": rank,
            "prefetch": prefetch,
            "read_ahead": read_ahead,
            "stats_every": stats_every,
            "on_stats": on_stats,
            "stats": stats,
            "bad_rows": bad_rows,
        }
        changes = {k: v for k, v in given.items() if v is not None}
        if stats_every == 0:  # the hook off: ``on_stats`` goes with it
            changes["on_stats"] = on_stats
        opts = replace(self._options, **changes)
        if io_options is None:
            return self._with(_options=opts)
        datasets = tuple(d.with_io_options(io_options) for d in self._datasets)
        return self._with(_options=opts, _datasets=datasets)

    # -- recipe facts --------------------------------------------------------------------------

    @property
    def pad_token_id(self) -> int:
        """The id padding positions hold (known once `pack_flat` or `pack_sequences` is set).

        Raises:
            ConfigError: before the packing step is set.
        """
        if self._pack is None:
            raise ConfigError("`pad_token_id` is known once `pack_flat` or `pack_sequences` is set")
        return pad_id(self)

    @property
    def exhaustion(self) -> str:
        """The work source's exhaustion policy."""
        return self._source.exhaustion

    @property
    def topology(self) -> tuple[int, int]:
        """``(world_size, rank)`` as resolved now (process group, environment, options)."""
        return resolve_topology(world_size=self._options.world_size, rank=self._options.rank)

    @property
    def lanes(self) -> list[int]:
        """The canonical lanes this pipeline emits, in emission order: the rank's, or the
        subset a DataLoader worker was given."""
        if self._lane_subset is not None:
            return list(self._lane_subset)
        world_size, rank = self.topology
        return lanes_for_rank(
            canonical_replicas=self._options.canonical_replicas,
            world_size=world_size,
            rank=rank,
            world_name=world_size_name(self._options.world_size),
        )

    def with_lanes(
        self, lanes: list[int], *, endless: bool = False, quiet: bool = False
    ) -> Pipeline:
        """The same recipe emitting only ``lanes`` (a subset of the rank's), in (turn, lane)
        order; used to split a rank's lanes across DataLoader workers. ``endless``: once these
        lanes are spent, keep yielding all-padding micro-batches rather than stopping, so that
        the main process, which sees every lane, decides where the rank's stream ends.
        ``quiet``: no warning of an iteration of a spent state (the loader gives it)."""
        own = set(self.lanes)
        if not set(lanes) <= own:
            raise ConfigError(
                f"lanes {sorted(set(lanes) - own)} are not this rank's lanes {sorted(own)}"
            )
        return self._with(_lane_subset=tuple(sorted(lanes)), _endless=endless, _quiet_spent=quiet)

    def fingerprint(self) -> dict[str, Any]:
        """Every data-affecting setting, flat; a saved state must match it key by key."""
        self._require_complete()
        return recipe_fingerprint(self)

    def _require_complete(self) -> None:
        if self._pack is None or self._microbatch_size is None:
            raise ConfigError(
                "the pipeline needs `tokenize` (or `pretokenized`), `pack_flat` (or "
                "`pack_sequences`) and `batch` before it runs"
            )

    # -- state ---------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """What was delivered so far, for this rank's lanes: plain JSON data (kilobytes with
        `wrap`; a bin packer adds its open rows' pieces, see the README). Raises
        ``ConfigError`` once a torch loader made from this pipeline has delivered batches (of
        its own copy) and this pipeline has not been iterated or loaded since: save the
        loader's state then."""
        if self._handed is not None:
            raise ConfigError(self._handed)
        return self._state_dict()

    def _state_dict(self) -> dict[str, Any]:
        lanes = {str(lane): self._lane_states.get(lane) for lane in self.lanes}
        return {
            "version": STATE_VERSION,
            "fingerprint": self.fingerprint(),
            # lane states index the datasets by position; a list, kept by any serialiser
            "datasets": list(self._source.names),
            "step": state_step(lanes),
            "microbatch_size": self._microbatch_size,  # what turns count (see `_regroup`)
            "estimation": copy.deepcopy(self._estimation),
            "lanes": pack_lanes(copy.deepcopy(lanes)),  # rows and readers packed
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (from any world size dividing L); raises on any mismatch,
        warns of a state saved mid-step. An iterator made before the load raises RuntimeError
        on its next call. A state saved with another micro-batch size goes on where its
        lanes' rows are whole micro-batches of this one (see ``_regroup``)."""
        state = self._load_state(state)
        self._warn_mid_step(state["lanes"])

    def _load_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """Loads ``state``; returns it with its turns in this pipeline's micro-batches."""
        self._require_complete()
        assert self._microbatch_size is not None
        state = loaded_state(state, self._microbatch_size, self.fingerprint(), self.lanes)
        self._check_in_step(state["lanes"])
        self._end_live()
        self._loads += 1
        self._lane_states = {lane: copy.deepcopy(state["lanes"][str(lane)]) for lane in self.lanes}
        self._estimation = copy.deepcopy(state.get("estimation"))
        return state

    def _check_in_step(self, lanes: dict[str, Any]) -> None:
        """Refuse a state's ``lanes`` of several ranks (merged, or of fewer ranks) that,
        loaded rank by rank, would leave the ranks at different turns (``check_in_step``)."""
        world_size = self.topology[0]
        if world_size > 1 and not set(map(int, lanes)) <= set(self.lanes):
            check_in_step(
                lanes, canonical_replicas=self._options.canonical_replicas, world_size=world_size
            )

    def _warn_mid_step(self, lanes: dict[str, Any]) -> None:
        """Warn of a state (its ``lanes``) that leaves this rank's lanes a turn apart
        (``step_remainder``): the micro-batches it gives first finish a step, which a loop
        counting whole steps from it does not expect."""
        left = step_remainder([lanes.get(str(lane)) for lane in self.lanes])
        if left:
            warn(
                f"{MID_STEP}: the first {left} of this rank's micro-batches "
                "from it finish the step it was saved in, so a loop counting "
                f"{len(self.lanes)} micro-batches a step from here is off by {left}; save "
                "states at step ends",
            )

    # -- running -------------------------------------------------------------------------------

    def to_torch(
        self, *, mask_document_boundaries: bool = False, attention_mask: bool = False
    ) -> PipelineDataset:
        """This pipeline as a torch ``IterableDataset`` of training dicts (see
        ``zephon_torch.torch``; the two flags as ``Batch.to_training`` takes them); the loaded
        state, if any, carries over. Its items are whole micro-batches: give a torch loader
        ``batch_size=None`` (its default of 1 adds a leading dimension)."""
        from zephon_torch.torch.dataset import PipelineDataset

        return PipelineDataset(
            self, mask_document_boundaries=mask_document_boundaries, attention_mask=attention_mask
        )

    def __len__(self) -> int:
        """Not sized: a stream. Refused with the way to a torch loader, which asks for a length
        where it takes a dataset for a map-style one."""
        raise TypeError(
            "a Pipeline is a stream, not a sized dataset: load it with "
            "zephon_torch.torch.DataLoader(pipeline), or give a torch loader "
            "pipeline.to_torch() (an IterableDataset) with batch_size=None"
        )

    def __bool__(self) -> bool:
        return True  # not from __len__

    def __iter__(self) -> Iterator[Batch]:
        """Micro-batches from the delivered (or loaded) state on. Only the newest iterator
        runs: an older one raises RuntimeError on its next call."""
        self._require_complete()
        self._end_live()
        fork_safe_backend()
        runtime = self._live_runtime = LaneRuntime(self)
        stream: Iterator[Batch]
        # under "repeat" a stream never ends: a rank whose lanes were dealt no document (a
        # dataset of fewer documents than lanes) pads, as those lanes do in one process
        endless = self._endless or self.exhaustion == "repeat"
        produce = partial(runtime.batches, endless=endless)
        depth = prefetch_depth(self)
        if depth:
            self._live = Prefetcher(produce, depth)
            stream = self._live
        else:
            stream = produce()
        delivering = deliver(self, stream, runtime, self._iteration)
        # an iterator dropped before its first next() never runs deliver's cleanup: its
        # threads stop when it is collected
        weakref.finalize(delivering, stop_iteration, self._live if depth else None, runtime)
        return delivering

    def explain(self, *, num_workers: int = 0) -> str:
        """The compiled plan as text: datasets and operators (data-affecting, in the
        fingerprint), then lanes, ranks, workers, runner and buffers (performance knobs)."""
        from zephon_torch._explain import explain

        self._require_complete()
        return explain(self, num_workers=num_workers)

    def stats(self) -> dict[str, Any]:
        """What the current (or last) iteration did: batches, tokens and tokens/s, delivered
        shares against targets (of tokens, or of documents begun for a mixture of document
        shares: ``shares_of``), padding fraction, documents skipped by policy, per
        operator time and throughput with its share, stalls (time the consumer waited for a
        batch, time packers waited for tokenized documents), mean prefetch queue occupancy,
        and the state size in bytes. Operator timings cover the threads runner. Skips are
        counted from the run's start (a resumed run's too) up to the last delivered batch's
        state (under ``shuffle``, up to the start of its block). A ``DataLoader`` iterates
        its own copy of the pipeline: this pipeline's stats stay empty then (the loader's
        ``stats()`` counts what the loop received)."""
        return pipeline_stats(self)

    def _end_live(self) -> None:
        """End the current iteration, before a new one or a loaded state: its prefetch thread
        and workers stop, its read-ahead goes, and its iterator raises from now on (see
        ``deliver``), even where the caller still holds it."""
        self._iteration += 1
        self._handed = None  # this pipeline moves: its own state is current again
        if self._live_runtime is not None:
            stop_iteration(self._live, self._live_runtime)
        self._live = self._live_runtime = None
