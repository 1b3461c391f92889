"""The live side of a pipeline: per owned lane, readers, a mix+pack node and a batch node.

Built fresh for every iteration from the recipe a ``Pipeline`` recorded and the delivered lane
states; emits micro-batches in (turn, lane) order. A turn in which none of the owned lanes has
data ends the stream (after a mid-turn resume, the started turn is completed first).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from zephon_torch._token_stage import doc_ops, pad_id, token_stage
from zephon_torch.ops._runner import DocChain, Runner
from zephon_torch.ops.batch import Batch, BatchNode
from zephon_torch.ops.estimate import calibrate, chunk_sizes
from zephon_torch.ops.fetch import FetchOp
from zephon_torch.ops.pack import MixPack, PackedRow
from zephon_torch.ops.packers import make_packer
from zephon_torch.ops.read import DocumentReader
from zephon_torch.ops.shuffle import ShuffleNode
from zephon_torch.ops.stateful import FilteredReader

if TYPE_CHECKING:
    from torchdata.nodes import BaseNode

    from zephon_torch.pipeline import Pipeline


class LaneRuntime:
    """The live nodes of one iteration: a runner, and per lane its readers, packer and batcher."""

    def __init__(self, pipeline: Pipeline) -> None:
        source = pipeline._source
        pack = pipeline._pack
        assert pack is not None and pipeline._microbatch_size is not None
        _, token_field, parallelism, runner = token_stage(pipeline)
        self.chain = DocChain(FetchOp(pipeline._datasets), doc_ops(pipeline))
        self.runner = Runner(self.chain, parallelism=parallelism, kind=runner)
        if pipeline._estimation is None and source.token_estimation is not None:
            pipeline._estimation = calibrate(
                self.chain,
                source.layouts,
                estimation=source.token_estimation,
                field=token_field,
            )
        chunk_docs = chunk_sizes(pipeline._estimation, source.names)
        num_lanes = pipeline._options.canonical_replicas
        self.nodes: list[BatchNode] = []
        self.readers: list[DocumentReader] = []
        for lane in pipeline.lanes:
            readers = [
                DocumentReader(
                    source=i,
                    layout=layout,
                    lane=lane,
                    num_lanes=num_lanes,
                    exhaustion=source.exhaustion,
                    passes=1 if source.passes is None else source.passes[i],
                    runner=self.runner,
                    chunk_docs=chunk_docs[i],
                    ahead=pipeline._options.read_ahead,
                )
                for i, layout in enumerate(source.layouts)
            ]
            self.readers.extend(readers)
            for factory, _ in pipeline._stateful:
                readers = [
                    FilteredReader(reader, factory(lane), name)
                    for reader, name in zip(readers, source.names)
                ]
            packer = make_packer(
                pack.algorithm, pack.max_length, pack.num_bins, pack.max_sequences_per_bin
            )
            mixpack = MixPack(
                readers,
                source.weights,
                source.mixing,
                packer,
                drop_longer_than=pack.max_length if pack.long_documents == "drop" else None,
                drop_shorter_than=pack.min_document_length,
            )
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
                pad_id=pad_id(pipeline),
                source_names=source.names,
            )
            node.reset(pipeline._lane_states.get(lane))
            self.nodes.append(node)

    def batches(self, *, endless: bool = False) -> Iterator[Batch]:
        """Micro-batches in (turn, lane) order until a turn where no owned lane has data
        (``endless``: never; all-padding turns go on).

        A batch with data goes out as soon as it is made; all-padding ones wait until the turn
        is known to hold data (else the stream ends there), so the first batch is not held up
        by the other lanes.
        """
        while True:
            turn = min(node.turn for node in self.nodes)
            pending = [node for node in self.nodes if node.turn == turn]
            live = len(pending) < len(self.nodes)  # a resumed, started turn is completed
            held: list[Batch] = []
            for node in pending:
                batch = next(node)
                if batch.num_tokens == 0 and not live:
                    held.append(batch)
                    continue
                live = True
                yield from held
                held = []
                yield batch
            if not live and not endless:
                return
            yield from held

    def operator_seconds(self) -> dict[str, tuple[float, int]]:
        """Per operator: seconds spent and documents out (threads runner; processes keep
        their own counters)."""
        return {
            name: (self.chain.seconds[name], self.chain.documents[name])
            for name in self.chain.seconds
        }

    def reader_waited(self) -> float:
        """Seconds the packers waited for tokenized documents."""
        return sum(r.waited for r in self.readers)

    def close(self) -> None:
        """Stop the workers."""
        self.runner.close()
