"""The live side of a pipeline: per owned lane, readers, a mix+pack node and a batch node.

Built fresh for every iteration from the recipe a ``Pipeline`` recorded and the delivered lane
states; emits micro-batches in (turn, lane) order. A turn in which none of the owned lanes has
data ends the stream (after a mid-turn resume, the started turn is completed first).
``deliver`` hands the micro-batches over and records what was delivered.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING

from zephon_torch._lane_warnings import warn_if_fewer_rows_than_lanes, warn_if_spent
from zephon_torch._resume_reads import read_ahead
from zephon_torch._stats import RunCounters
from zephon_torch._token_stage import (
    columnar,
    doc_ops,
    id_check,
    pad_id,
    plain_documents,
    read_datasets,
    shard_paths,
    token_stage,
)
from zephon_torch._turn_order import cut_at_empty_turn, cut_lone_lane, skip_spent_turns, spent_at
from zephon_torch.errors import DataError, row_fault
from zephon_torch.io._rows import name_line
from zephon_torch.io.dataset import Dataset
from zephon_torch.ops._doc_chain import DocChain
from zephon_torch.ops._runner import Runner
from zephon_torch.ops.batch import Batch, BatchNode
from zephon_torch.ops.columns import TokenChain
from zephon_torch.ops.estimate import calibrate, chunk_sizes
from zephon_torch.ops.fetch import FetchOp
from zephon_torch.ops.pack import MixPack, PackedRow
from zephon_torch.ops.packers import make_packer
from zephon_torch.ops.prefetch import Prefetcher
from zephon_torch.ops.read import DocumentReader
from zephon_torch.ops.shuffle import ShuffleNode
from zephon_torch.ops.stateful import FilteredReader, made_filter

_LEAVE_S = 1.0  # how long leaving a loop waits, in all, for calls still running

if TYPE_CHECKING:
    from torchdata.nodes import BaseNode

    from zephon_torch.pipeline import Pipeline


def doc_chain(pipeline: Pipeline) -> DocChain:
    """Fetch and the pipeline's per-document operators, skipping bad rows where asked."""
    skip = pipeline._options.bad_rows == "skip"
    return DocChain(FetchOp(read_datasets(pipeline)), doc_ops(pipeline), skip_bad_rows=skip)


def calibrated(pipeline: Pipeline, chain: DocChain | None = None) -> None:
    """Calibrate ``pipeline``'s token estimation, where its mixture has one and it has no
    figures yet (from a first run or a loaded state), with ``chain`` (default: its own)."""
    source = pipeline._source
    if pipeline._estimation is not None or source.token_estimation is None:
        return
    if chain is None:
        chain = doc_chain(pipeline)
    try:
        pipeline._estimation = calibrate(
            chain,
            source.layouts,
            estimation=source.token_estimation,
            field=token_stage(pipeline)[1],
        )
    except DataError as error:  # a row read to calibrate: named by its line too
        explain_row_error(error, pipeline)
        raise


def explain_row_error(error: DataError, pipeline: Pipeline) -> None:
    """Add to a ``DataError`` leaving an iteration its row's line in a JSONL file
    (`name_line`) and, where a row is at fault and bad rows are raised, that they can be
    skipped."""
    name_line(error, read_datasets(pipeline))
    if row_fault(error) and pipeline._options.bad_rows != "skip":
        error.add_place("options(bad_rows='skip') skips such rows and counts them")


class LaneRuntime:
    """The live nodes of one iteration: a runner, and per lane its readers, packer and batcher."""

    def __init__(self, pipeline: Pipeline) -> None:
        _, token_field, parallelism, runner = token_stage(pipeline)
        chain = doc_chain(pipeline)
        self.chain: DocChain | TokenChain = chain
        if columnar(pipeline):
            assert pipeline._pretokenized is not None
            eos = pipeline._pretokenized.eos_token_id
            skip = chain.skip_bad_rows
            self.chain = TokenChain(read_datasets(pipeline), token_field, eos, skip_bad_rows=skip)
        self.runner = Runner(self.chain, parallelism=parallelism, kind=runner)
        self.nodes: list[BatchNode] = []
        self.readers: list[DocumentReader] = []
        # the turn whose emptiness ended a finite stream: its all-padding batches go
        # undelivered, but their states (each lane spent) are the lanes' final ones
        self.cut_turn: list[Batch] = []
        try:
            self._build(pipeline, chain)
        except BaseException:
            # held by the error's traceback, an open runner kept its processes' pipes and its
            # chain file (whose lock kept `sweep` off it) for as long as the error lived
            self.close()
            raise

    def _build(self, pipeline: Pipeline, doc_chain: DocChain) -> None:
        """Calibrate, then make each owned lane's readers, packer and batcher."""
        source = pipeline._source
        pack = pipeline._pack
        assert pack is not None and pipeline._microbatch_size is not None
        calibrated(pipeline, doc_chain)
        chunk_docs = chunk_sizes(pipeline._estimation, source.names)
        num_lanes = pipeline._options.canonical_replicas
        warn_if_fewer_rows_than_lanes(source, num_lanes)
        where = (list(source.names), shard_paths(pipeline))  # user errors name their row
        states = {lane: pipeline._lane_states.get(lane) for lane in pipeline.lanes}
        if not pipeline._endless:  # all the rank's lanes, cut here (a worker's are not)
            states = skip_spent_turns(states)
        padding, checker = pad_id(pipeline), id_check(pipeline)  # the same for every lane
        made: set[int] = set()  # the stateful filters made: a new one for each reader
        warned: set[tuple[str, str]] = set()  # warnings given, by dataset (see MixPack)
        lanes: list[tuple[list[DocumentReader | FilteredReader], BatchNode]] = []
        for lane in pipeline.lanes:
            readers: list[DocumentReader | FilteredReader] = list(
                self._readers(pipeline, lane, chunk_docs)
            )
            for factory, filter_name in pipeline._stateful:
                readers = [
                    FilteredReader(
                        reader, made_filter(factory, lane, filter_name, made), name, where
                    )
                    for reader, name in zip(readers, source.names)
                ]
            mixpack = _mixpack(pipeline, readers, where[1], warned)
            rows: BaseNode[PackedRow] = mixpack
            if pipeline._shuffle_window is not None:
                rows = ShuffleNode(
                    mixpack, window=pipeline._shuffle_window, seed=source.seed, lane=lane
                )
            node = BatchNode(
                rows,
                microbatch_size=pipeline._microbatch_size,
                max_length=pack.max_length,
                lane=lane,
                pad_id=padding,
                source_names=source.names,
                plain=plain_documents(pipeline),
                id_check=checker,
                payloads=bool(pack.payload_fields),
            )
            lanes.append((readers, node))
        # every lane's saved open rows read side by side, before the lanes restore in turn
        read_ahead([(readers, states[node.lane]) for readers, node in lanes])
        for _, node in lanes:
            node.reset(states[node.lane])
            self.nodes.append(node)

    def _readers(
        self, pipeline: Pipeline, lane: int, chunk_docs: list[int]
    ) -> list[DocumentReader]:
        """The lane's reader of each source, reading through this runtime's runner."""
        source = pipeline._source
        readers = [
            DocumentReader(
                source=i,
                layout=layout,
                lane=lane,
                num_lanes=pipeline._options.canonical_replicas,
                exhaustion=source.exhaustion,
                passes=1 if source.passes is None else source.passes[i],
                runner=self.runner,
                chunk_docs=chunk_docs[i],
                ahead=pipeline._options.read_ahead,
                share=source.weights[i],
            )
            for i, layout in enumerate(source.layouts)
        ]
        self.readers.extend(readers)
        return readers

    def batches(self, *, endless: bool = False) -> Iterator[Batch]:
        """Micro-batches in (turn, lane) order until a turn in which no owned lane has data
        (see `cut_at_empty_turn`); ``endless``: never cut, all-padding turns go on."""
        ahead = max(node.turn for node in self.nodes)
        if endless:
            return self._turns()
        if len(self.nodes) == 1:
            step = self.nodes[0].next  # reset when built
            return cut_lone_lane(step, ahead=ahead, ended=self.cut_turn.extend)
        return cut_at_empty_turn(
            self._turns(),
            turn=lambda b: b.turn,
            tokens=lambda b: b.num_tokens,
            ahead=ahead,
            ended=self.cut_turn.extend,
        )

    def _turns(self) -> Iterator[Batch]:
        """Every lane's next micro-batch, turn by turn, forever (spent lanes pad)."""
        if len(self.nodes) == 1:
            step = self.nodes[0].next  # reset when built: BaseNode's check is skipped
            while True:
                yield step()
        while True:
            turn = min(node.turn for node in self.nodes)
            for node in self.nodes:
                if node.turn == turn:
                    yield node.next()

    def operator_seconds(self) -> dict[str, tuple[float, int]] | None:
        """Per operator: seconds spent and documents out; None with the processes runner,
        whose processes keep their own counters (here they read zero)."""
        if self.runner.kind == "processes":
            return None
        return {
            name: (self.chain.seconds[name], self.chain.documents[name])
            for name in self.chain.seconds
        }

    def reader_waited(self) -> float:
        """Seconds the packers waited for tokenized documents."""
        return sum(r.waited for r in self.readers)

    def close(self) -> None:
        """Stop the workers and drop what the iteration held (read-ahead, open rows, batch
        buffers); the counters stay for ``stats()``. Ends the iteration: run again, it is
        called once more, harmlessly."""
        self.runner.close()
        for reader in self.readers:
            reader.close()
        self.nodes = []


def deliver(
    pipeline: Pipeline, stream: Iterator[Batch], runtime: LaneRuntime, iteration: int
) -> Iterator[Batch]:
    """Hand ``stream``'s micro-batches to the consumer, recording each lane's delivered state
    in ``pipeline`` (and the stats counters, and the periodic stats hook); stops the producer
    and the runtime when the consumer stops.

    ``iteration`` is the pipeline's ``_iteration`` when this iterator was made. Once a later
    ``iter()`` or ``load_state_dict`` has moved it on, the next call raises RuntimeError: the
    stream would otherwise go on from where it was and record its states over the loaded ones
    (or, its prefetch thread stopped, wait forever). So does a call in flight on another
    thread meanwhile, whatever the emptied stream raised or returned.
    """
    options = pipeline._options
    every, hook, counting = options.stats_every, options.on_stats, options.stats
    resumed = any(pipeline._lane_states.get(lane) is not None for lane in pipeline.lanes)
    delivered = 0
    counters = None
    try:
        if pipeline._iteration == iteration:
            counters = RunCounters(count_documents=pipeline._source.mixing == "documents")
            pipeline._runtime, pipeline._counters = runtime, counters
        while True:
            if pipeline._iteration != iteration:  # checked here first: this runs every batch
                _check_current(pipeline, iteration)
            start = time.perf_counter() if counting else 0.0
            try:
                batch = next(stream, None)
            except Exception as error:
                # another thread's iter() or load_state_dict ended this iteration while
                # ``stream`` ran on this one (no prefetch thread) and emptied its readers
                _check_current(pipeline, iteration, error)
                if isinstance(error, DataError):
                    explain_row_error(error, pipeline)
                raise
            # ended meanwhile, ``stream`` may still have made a batch: its state would be
            # recorded over the loaded one
            if pipeline._iteration != iteration:
                _check_current(pipeline, iteration)
            if batch is None:
                # each lane's state after the empty turn that ended the stream: spent, so
                # the per-rank states of a run that ended (ranks turns apart) merge
                for last in runtime.cut_turn:
                    pipeline._lane_states[last.lane] = spent_at(last.state)
                # endless or quiet: DataLoader workers, whose loader tells
                if not (pipeline._endless or pipeline._quiet_spent):
                    warn_if_spent(resumed, delivered)
                return
            delivered += 1
            if counting:
                queued = stream.queued() if isinstance(stream, Prefetcher) else None
                pipeline._counters.delivered(batch, time.perf_counter() - start, queued)
            if hook is not None and every and pipeline._counters.batches % every == 0:
                hook(pipeline.stats())  # first: a hook that raises leaves the batch undelivered
            pipeline._lane_states[batch.lane] = batch.state
            yield batch
    finally:
        if counters is not None:  # stats of an iteration that ended stay as they were
            counters.ended = time.perf_counter()
        stop_iteration(stream if isinstance(stream, Prefetcher) else None, runtime)


def _mixpack(
    pipeline: Pipeline,
    readers: list[DocumentReader | FilteredReader],
    paths: list[list[str]],
    warned: set[tuple[str, str]],
) -> MixPack:
    """A lane's mixer and packer over its ``readers`` (one per source); ``warned``: the
    warnings the iteration's lanes have given, by dataset (shared)."""
    source, pack = pipeline._source, pipeline._pack
    assert pack is not None
    packer = make_packer(pack.algorithm, pack.max_length, pack.num_bins, pack.max_sequences_per_bin)
    return MixPack(
        readers,
        source.weights,
        source.mixing,
        packer,
        drop_longer_than=pack.max_length if pack.long_documents == "drop" else None,
        drop_shorter_than=pack.min_document_length,
        shard_paths=paths,
        long_rule=(
            f"pack_sequences, which drops documents above max_length={pack.max_length}"
            if pack.whole
            else None
        ),
        warned=warned,
        line_of=partial(_line_of, read_datasets(pipeline), paths),
    )


def _line_of(
    datasets: Sequence[Dataset], paths: list[list[str]], source: int, shard: int, row: int
) -> str | None:
    """``Dataset.line_of`` of a row told by source and shard index (``MixPack``'s
    ``line_of``)."""
    return datasets[source].line_of(paths[source][shard], row)


def stop_iteration(prefetcher: Prefetcher[Batch] | None, runtime: LaneRuntime) -> None:
    """Stop an iteration's threads (again, harmlessly, where it ran to its end), waiting about
    a second in all for those still in a call: the prefetch thread and then the runner's
    threads each waited a second of their own (two, leaving a loop while a map ran)."""
    deadline = time.monotonic() + _LEAVE_S
    if prefetcher is not None:
        prefetcher.stop()  # first: the runner's chunks, cancelled, let it end
    runtime.runner.close(deadline)
    if prefetcher is not None:
        prefetcher.close(deadline)
    runtime.close()  # its readers, once the prefetch thread has left them


def _check_current(pipeline: Pipeline, iteration: int, error: BaseException | None = None) -> None:
    """Raise RuntimeError (from ``error``, what the ended iteration raised) where a later
    ``iter()`` or ``load_state_dict`` has ended ``iteration``."""
    if pipeline._iteration != iteration:
        raise RuntimeError(
            "this iterator of the pipeline is stale: the pipeline was iterated again "
            "or loaded a state since it was made; call iter(pipeline) to continue from "
            "the pipeline's current state"
        ) from error
