"""How far each (lane, source) reader reads ahead: in proportion to its source's share."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.unit.io.test_io_formats_writers import write_mds
from zephon_torch import Pipeline
from zephon_torch.errors import ZephonWarning
from zephon_torch.io import Dataset
from zephon_torch.ops._runner import Runner
from zephon_torch.ops.columns import TokenChain
from zephon_torch.ops.estimate import DEFAULT_CHUNK_DOCS
from zephon_torch.ops.read import _VIEW_TOKENS, DocumentReader
from zephon_torch.work import StaticMixtureWorkSource
from zephon_torch.work.pointers import PointerLayout, PointerSpan


def counted_read(count: itertools.count[int], row: dict[str, Any]) -> dict[str, Any]:
    next(count)
    return row


def test_a_lane_of_many_sources_reads_about_one_chunk_ahead_of_each_small_one() -> None:
    """Every reader kept its full read-ahead whatever its share, so a lane's grew with the
    number of sources: each source, once first due, had 15 chunks read, here all 38,400
    documents for the 384 the first 12 micro-batches hold; 300 sources on 8 lanes read
    every document four times over in 20 steps, 18 times as slow as 10 sources."""
    sources, rows = 64, 600
    datasets = [
        Dataset.from_dict(
            f"s{d:02d}", {"ids": [np.full(3, d + 1, dtype=np.int32)] * rows}, shard_size=50
        )
        for d in range(sources)
    ]
    count = itertools.count()
    pipeline = (
        Pipeline(StaticMixtureWorkSource(datasets, seed=1, exhaustion="repeat"))
        .map(lambda row: counted_read(count, row), name="count")
        .pretokenized("ids", eos_token_id=0, runner="inline")  # read when submitted
        .pack_flat(64)
        .batch(2)
    )
    delivered: set[str] = set()
    documents = 0
    for batch in itertools.islice(pipeline, 12):
        begun = batch.documents_by_source()
        documents += sum(begun.values())
        delivered |= {name for name, n in begun.items() if n}
    assert len(delivered) == sources  # every reader has started
    read = next(count)
    # the chunk being taken and one more in flight, of DEFAULT_CHUNK_DOCS, for each source
    assert read <= documents + sources * 2 * DEFAULT_CHUNK_DOCS, read


def test_a_source_of_a_quarter_or_more_keeps_the_full_read_ahead() -> None:
    datasets = [
        Dataset.from_dict(name, {"ids": [np.full(3, 1, dtype=np.int32)] * 4000})
        for name in ("big", "small")
    ]
    source = StaticMixtureWorkSource(datasets, {"big": 0.75, "small": 0.25}, seed=1)
    pipeline = Pipeline(source).pretokenized("ids", eos_token_id=0).pack_flat(64).batch(2)
    next(iter(pipeline))
    assert pipeline._runtime is not None
    big, small = pipeline._runtime.readers
    assert (big.ahead, big._growth) == (small.ahead, small._growth) == (4, 8)


def test_a_small_source_left_alone_reads_fully_ahead_and_so_does_its_resume() -> None:
    """Once the other sources are spent (exhaustion="stop"), a small source is the whole lane:
    it kept the read-ahead of its 1% share, one chunk in flight, to the end of the run."""
    datasets = [
        Dataset.from_dict("big", {"ids": [np.full(3, 1, dtype=np.int32)] * 40}),
        Dataset.from_dict("small", {"ids": [np.full(3, 2, dtype=np.int32)] * 4000}),
    ]

    def pipeline() -> Pipeline:
        source = StaticMixtureWorkSource(
            datasets, {"big": 0.99, "small": 0.01}, seed=1, exhaustion="stop"
        )
        return (
            Pipeline(source)
            .options(canonical_replicas=1)
            .pretokenized("ids", eos_token_id=0)
            .pack_flat(64)
            .batch(2)
        )

    run = pipeline()
    batches = iter(run)
    next(batches)
    assert run._runtime is not None
    small = run._runtime.readers[1]
    assert (small.ahead, small._growth) == (1, 1)  # 1% of the mixture
    state = None
    with pytest.warns(ZephonWarning, match="'big' ran out"):
        for batch in batches:
            if batch.documents_by_source().get("big", 0) == 0:  # big is spent
                state = run.state_dict()
                break
    assert state is not None and (small.ahead, small._growth) == (4, 8)
    resumed = pipeline()
    resumed.load_state_dict(state)
    next(iter(resumed))
    assert resumed._runtime is not None
    assert (resumed._runtime.readers[1].ahead, resumed._runtime.readers[1]._growth) == (4, 8)


def _submitted_spans(
    *,
    eos_token_id: int | None,
    rows: int,
    length: int,
    chunk_docs: int,
    passes: int = 1,
    stored: tuple[Dataset, str] | None = None,
) -> tuple[list[tuple[int, int, int]], list[int]]:
    """A one-lane reader of ``rows`` documents of ``length`` ids (document i all ids i % 100),
    read to the end through ``columns``/``advance`` with one chunk in flight: the (pass, pos,
    count) of each chunk submitted to the runner, and each document's first id. ``stored``:
    those documents as a dataset of one shard and their field (default: a dict's)."""
    if stored is None:
        ids = [np.full(length, i % 100, dtype=np.int32) for i in range(rows)]
        stored = (Dataset.from_dict("d", {"ids": ids}, shard_size=rows), "ids")
    dataset, field = stored
    runner = Runner(TokenChain((dataset,), field, eos_token_id), parallelism=1, kind="inline")
    layout = PointerLayout(name="d", shard_rows=(rows,), seed=1, window_shards=1, shuffle=False)
    reader = DocumentReader(
        source=0,
        layout=layout,
        lane=0,
        num_lanes=1,
        exhaustion="stop",
        passes=passes,
        runner=runner,
        chunk_docs=chunk_docs,
        ahead=1,
    )
    spans: list[tuple[int, int, int]] = []
    submit = runner.submit

    def recorded(source: int, span: PointerSpan) -> Any:
        spans.append((span.pass_index, span.pos, len(span)))
        return submit(source, span)

    runner.submit = recorded  # type: ignore[method-assign]
    reader.reset()
    seen: list[int] = []
    while (found := reader.columns()) is not None:
        chunk, index = found
        seen.extend(int(tokens[0]) for tokens in chunk.tokens[index:])
        reader.advance(len(chunk))
    reader.close()
    return spans, seen


def test_chunks_double_from_chunk_docs_to_eight_times_it_and_end_at_the_lane_s_end() -> None:
    """Small first chunks (a fast first batch), then 8x ``chunk_docs`` in the steady state;
    the last chunk of a pass holds what is left of it, and the next pass starts anew at 0."""
    spans, seen = _submitted_spans(eos_token_id=0, rows=70, length=3, chunk_docs=2, passes=2)
    first = [(0, 0, 2), (0, 2, 4), (0, 6, 8), (0, 14, 16), (0, 30, 16), (0, 46, 16), (0, 62, 8)]
    second = [(1, 0, 16), (1, 16, 16), (1, 32, 16), (1, 48, 16), (1, 64, 6)]
    assert spans == first + second
    assert seen == list(range(70)) * 2


def test_chunks_of_stored_views_grow_further_but_hold_about_view_tokens_tokens() -> None:
    """Token columns read inline without an EOS are views of the stored ids: their chunks grow
    to 256x ``chunk_docs``, but once the documents' mean length is known, to no more than
    about ``_VIEW_TOKENS`` tokens (here four documents of a quarter of it)."""
    spans, _ = _submitted_spans(eos_token_id=None, rows=1100, length=4, chunk_docs=1)
    assert [count for _, _, count in spans] == [1 << i for i in range(9)] + [256, 256, 77]
    spans, seen = _submitted_spans(
        eos_token_id=None, rows=24, length=_VIEW_TOKENS // 4, chunk_docs=1
    )
    assert [count for _, _, count in spans] == [1, 2, 4, 4, 4, 4, 4, 1]
    assert seen == list(range(24))


@pytest.mark.parametrize("kind", ["npy", "mds", "mds-zstd"])
def test_chunks_of_mapped_views_grow_eight_times_a_chunk_without_the_token_cap(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Views of mapped files (`.npy` files, uncompressed MDS shards) hold no decoded shard:
    their chunks grow 8x a chunk to 256x ``chunk_docs``, whatever the documents' length; the
    same documents in compressed MDS shards, decoded, keep to about ``_VIEW_TOKENS`` tokens
    a chunk (here four documents of a quarter of it)."""
    from zephon_torch.ops import read

    rows, length = 1200, 100
    monkeypatch.setattr(read, "_VIEW_TOKENS", 4 * length)
    docs = np.repeat(np.arange(rows, dtype=np.int32) % 100, length).reshape(rows, length)
    if kind == "npy":
        (tmp_path / "npy").mkdir()
        np.save(tmp_path / "npy" / "0.npy", docs)
        dataset = Dataset.from_path("d", tmp_path / "npy")
    else:
        compression = "zstd" if kind == "mds-zstd" else None
        out = write_mds(
            tmp_path / "mds",
            [{"input_ids": doc} for doc in docs],
            {"input_ids": "ndarray:int32"},
            compression=compression,
            size_limit=1 << 30,
        )
        dataset = Dataset.from_path("d", out)
    assert len(dataset.shards) == 1
    assert dataset.maps_token_ids() == (kind != "mds-zstd")
    spans, seen = _submitted_spans(
        eos_token_id=None,
        rows=rows,
        length=length,
        chunk_docs=1,
        stored=(dataset, "input_ids"),
    )
    counts = [count for _, _, count in spans]
    if kind == "mds-zstd":
        assert counts == [1, 2] + [4] * 299 + [1]
    else:
        assert counts == [1, 8, 64, 256, 256, 256, 256, 103]
    assert seen == [i % 100 for i in range(rows)]


def test_a_document_fetched_again_is_the_one_its_pass_and_pos_hold_read_ahead_or_not() -> None:
    """A resumed lane re-reads the documents its saved open rows hold: those read ahead
    (``read_ahead_for_resume``) come from the runner, the others (one fetched a second time,
    a document two saved rows hold pieces of) are read now; either way from their own pass,
    whose shuffled order differs from the first's."""
    rows = 40
    ids = [np.full(2, i, dtype=np.int32) for i in range(rows)]
    dataset = Dataset.from_dict("d", {"ids": ids}, shard_size=10)
    layout = PointerLayout(name="d", shard_rows=(10,) * 4, seed=1, window_shards=2, shuffle=True)

    def reader() -> DocumentReader:
        return DocumentReader(
            source=0,
            layout=layout,
            lane=0,
            num_lanes=1,
            exhaustion="stop",
            passes=2,
            runner=Runner(TokenChain((dataset,), "ids", None), parallelism=1, kind="inline"),
            chunk_docs=4,
            ahead=1,
        )

    streamed = reader()
    seen: list[int] = []
    while (found := streamed.columns()) is not None:
        chunk, index = found
        seen.extend(int(tokens[0]) for tokens in chunk.tokens[index:])
        streamed.advance(len(chunk))
    by_pass = [seen[:rows], seen[rows:]]
    assert by_pass[0] != by_pass[1] and sorted(by_pass[1]) == list(range(rows))
    resumed = reader()
    resumed.read_ahead_for_resume([(1, 3), (0, 5)])
    for pass_index, pos in [(1, 3), (0, 5), (1, 3), (1, 7)]:  # the last two read now
        document = resumed.fetch(pass_index, pos)
        assert (document.pass_index, document.pos) == (pass_index, pos)
        assert document.tokens is not None
        assert int(document.tokens[0]) == by_pass[pass_index][pos]
