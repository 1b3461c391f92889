"""What the pipeline delivers: nothing lost or repeated, the same data for every knob."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import prose_documents
from tests.helpers import keys, small_pipeline
from zephon_torch import Batch, DataError, Pipeline
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource, TokenEstimation


def write_jsonl(directory: Path, texts: list[str], shards: int) -> Path:
    directory.mkdir(parents=True)
    for s in range(shards):
        with open(directory / f"part-{s:03d}.jsonl", "w") as f:
            for i in range(s, len(texts), shards):
                f.write(json.dumps({"text": texts[i], "n": i}) + "\n")
    return directory


def documents_from_batches(batches: list[Batch]) -> dict[str, list[list[int]]]:
    """Rebuild each source's documents from segments: a document starts at a start flag."""
    per_stream: dict[tuple[int, int], list[list[int]]] = defaultdict(list)
    for batch in batches:
        for r, (lengths, sources, starts) in enumerate(
            zip(batch.lengths, batch.sources, batch.starts_document)
        ):
            offset = 0
            for n, source, start in zip(lengths, sources, starts):
                tokens = batch.input_ids[r, offset : offset + n].tolist()
                offset += n
                docs = per_stream[(batch.lane, source)]
                if start:
                    docs.append(tokens)
                else:
                    docs[-1].extend(tokens)
    out: dict[str, list[list[int]]] = defaultdict(list)
    for (_, source), docs in per_stream.items():
        out[batches[0].source_names[source]].extend(docs)
    return out


@pytest.mark.parametrize("lanes", [1, 3])
def test_one_pass_with_wrap_delivers_every_document_once_in_order(
    tmp_path: Path, tokenizer: Any, lanes: int
) -> None:
    texts = {"a": prose_documents(70, seed=11), "b": prose_documents(45, seed=12, max_words=30)}
    datasets = [
        Dataset.from_path(name, write_jsonl(tmp_path / name, t, 3)) for name, t in texts.items()
    ]
    source = StaticMixtureWorkSource(
        datasets, {"a": 1, "b": 1}, seed=3, token_estimation=TokenEstimation()
    )
    pipeline = (
        Pipeline(source)
        .options(canonical_replicas=lanes)
        .tokenize(tokenizer=tokenizer)
        .pack_flat(50)
        .batch(3)
    )
    batches = list(pipeline)
    got = documents_from_batches(batches)
    eos = tokenizer.token_to_id("<|endoftext|>")
    for name, t in texts.items():
        expected = sorted([*tokenizer.encode(x, add_special_tokens=False).ids, eos] for x in t)
        assert sorted(got[name]) == expected
    # all rows but each lane's last are full, and the padding is marked as such
    for batch in batches:
        training = batch.to_training()
        assert int(training["num_valid_tokens"]) <= batch.num_tokens


def test_parallelism_and_runner_never_change_the_data(tokenizer: Any) -> None:
    def run(parallelism: int, runner: str, prefetch: int = 4) -> list[Any]:
        return keys(
            small_pipeline(
                tokenizer, lanes=3, parallelism=parallelism, runner=runner, prefetch=prefetch
            )
        )

    reference = run(1, "threads", prefetch=0)
    assert len(reference) > 20
    for parallelism in (2, 4):
        assert run(parallelism, "threads") == reference
    for parallelism in (1, 2, 4):
        assert run(parallelism, "processes") == reference


def test_filter_and_map_apply_before_tokenizing_and_keep_resume_exact(tokenizer: Any) -> None:
    from tests.helpers import assert_resumes_at_every_step

    def build() -> Pipeline:
        base = small_pipeline(tokenizer)
        return (
            Pipeline(base._source)
            .map(upper_text)
            .filter(has_even_length)
            .tokenize(tokenizer=tokenizer)
            .pack_flat(48)
            .batch(2)
        )

    batches = list(build())
    decoded = tokenizer.decode(batches[0].input_ids[0].tolist())
    assert decoded == decoded.upper()
    assert_resumes_at_every_step(build)


def upper_text(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "text": row["text"].upper()}


def has_even_length(row: dict[str, Any]) -> bool:
    return len(row["text"]) % 2 == 0


def test_training_tensors_follow_the_segments(tokenizer: Any) -> None:
    batch = next(
        iter(small_pipeline(tokenizer, algorithm="best_fit", max_length=64, microbatch_size=4))
    )
    t = batch.to_training(mask_document_boundaries=True)
    ids, labels, pos = t["input_ids"], t["labels"], t["position_ids"]
    assert ids.dtype == labels.dtype == pos.dtype == np.int64 or str(ids.dtype) == "torch.int64"
    cu = t["cu_seqlens"].tolist()
    assert cu[0] == 0 and cu[-1] == ids.numel()
    flat_pos = pos.flatten().tolist()
    for start, end in itertools.pairwise(cu):
        assert flat_pos[start:end] == list(range(end - start))
    assert int(t["max_seqlen"]) == max(b - a for a, b in itertools.pairwise(cu))
    for r, lengths in enumerate(batch.lengths):
        offset = 0
        for n in lengths:
            assert (
                labels[r, offset : offset + n - 1].tolist()
                == ids[r, offset + 1 : offset + n].tolist()
            )
            assert int(labels[r, offset + n - 1]) == -100
            offset += n
        assert (labels[r, offset:] == -100).all()
    assert int(t["num_valid_tokens"]) == int((labels != -100).sum())


def test_batch_to_a_device_gives_the_training_tensors_there(tokenizer: Any) -> None:
    import torch

    batch = next(iter(small_pipeline(tokenizer)))
    moved = batch.to("cpu")
    reference = batch.to_training()
    assert moved.keys() == reference.keys()
    assert all(torch.equal(moved[k], reference[k]) for k in moved)
    if torch.cuda.is_available():
        on_gpu = batch.to("cuda")
        assert on_gpu["input_ids"].is_cuda and torch.equal(
            on_gpu["input_ids"].cpu(), reference["input_ids"]
        )


def test_passes_read_each_dataset_that_many_times_reshuffled(
    tmp_path: Path, tokenizer: Any
) -> None:
    texts = {
        "a": prose_documents(12, seed=21, max_words=40),
        "b": prose_documents(9, seed=22, max_words=40),
    }
    datasets = [Dataset.from_dict(name, {"text": t}, shard_size=4) for name, t in texts.items()]
    source = StaticMixtureWorkSource(
        datasets, seed=3, passes={"a": 3, "b": 1}, token_estimation=TokenEstimation()
    )
    batches = list(Pipeline(source).tokenize(tokenizer=tokenizer).pack_flat(30).batch(2))
    got = documents_from_batches(batches)
    eos = tokenizer.token_to_id("<|endoftext|>")
    for name, copies in (("a", 3), ("b", 1)):
        one = sorted([*tokenizer.encode(x, add_special_tokens=False).ids, eos] for x in texts[name])
        assert sorted(got[name]) == sorted(one * copies)
    first_pass, second_pass = got["a"][:12], got["a"][12:24]
    assert sorted(first_pass) == sorted(second_pass) and first_pass != second_pass


def test_passes_resume_exactly_across_pass_boundaries(tokenizer: Any) -> None:
    from tests.helpers import assert_resumes_at_every_step

    datasets = [
        Dataset.from_dict("a", {"text": prose_documents(6, seed=5, max_words=30)}, shard_size=2)
    ]

    def build() -> Pipeline:
        source = StaticMixtureWorkSource(datasets, seed=1, passes=3)
        return (
            Pipeline(source)
            .options(canonical_replicas=2)
            .tokenize(tokenizer=tokenizer)
            .pack_flat(24)
            .batch(1)
        )

    assert assert_resumes_at_every_step(build) > 6


def test_passes_are_refused_with_repeat_and_must_be_positive() -> None:
    from zephon_torch import ConfigError

    d = [Dataset.from_dict("a", {"text": ["x"]})]
    with pytest.raises(ConfigError, match="never ends"):
        StaticMixtureWorkSource(d, exhaustion="repeat", passes=2)
    with pytest.raises(ConfigError, match="must be positive"):
        StaticMixtureWorkSource(d, passes={"a": 0})
    with pytest.raises(ConfigError, match="unknown datasets"):
        StaticMixtureWorkSource(d, passes={"zz": 2})


def _needs_title(row: dict[str, Any]) -> dict[str, Any]:
    return {"text": row["title"] + row["text"]}


def _short(row: dict[str, Any]) -> bool:
    return len(row["text"]) < int(row["limit"])


def _drops_notes_without_title(row: dict[str, Any]) -> dict[str, Any] | None:
    return row if "title" in row else None  # a map that forgets to return on one branch


def tag_in_place(row: dict[str, Any]) -> dict[str, Any]:
    row["tags"].append("x")  # a nested value, changed in place
    row["text"] = row["text"] + " " + " ".join(row["tags"])
    return row


@pytest.mark.parametrize("kind", ["memory", "parquet"])
def test_a_map_changing_a_nested_value_in_place_changes_no_later_read(
    tokenizer: Any, tmp_path: Path, kind: str
) -> None:
    """Readers share nested values with a cache or the caller's data: the edit of a pass
    reached the next passes' reads, and the threads and processes runners gave other data."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"text": f"doc {i}", "tags": ["a"]} for i in range(6)]
    if kind == "memory":
        dataset = Dataset.from_dict("d", rows, shard_size=3)
    else:
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rows.parquet")
        dataset = Dataset.from_path("d", tmp_path / "rows.parquet")

    def texts(runner: str) -> list[str]:
        estimation = TokenEstimation(calibration_documents=1)
        source = StaticMixtureWorkSource(
            [dataset], shuffle=False, passes=3, token_estimation=estimation
        )
        pipeline = (
            Pipeline(source)
            .map(tag_in_place)
            .tokenize(tokenizer=tokenizer, runner=runner, parallelism=1, special_tokens="none")  # type: ignore[arg-type]
            .pack_flat(64, "best_fit", max_sequences_per_bin=1)
            .batch(1)
        )
        return [tokenizer.decode(b.input_ids[0, : b.num_tokens].tolist()) for b in pipeline]

    expected = [f"doc {i} a x" for i in range(6)] * 3
    assert texts("threads") == expected
    assert texts("processes") == expected
    assert rows[0]["tags"] == ["a"]  # the caller's own data is left alone


def scale_in_place(row: dict[str, Any]) -> dict[str, Any]:
    row["emb"] *= 2  # a writable array, changed in place
    return {"text": f"{row['text']} {int(row['emb'][0])}"}


def test_a_map_changing_an_array_in_place_changes_no_later_read(tokenizer: Any) -> None:
    """Writable arrays were passed as they were: each pass doubled the stored array again."""
    embeddings = [np.ones(3) for _ in range(4)]
    dataset = Dataset.from_dict("d", {"text": [f"doc {i}" for i in range(4)], "emb": embeddings})
    source = StaticMixtureWorkSource([dataset], shuffle=False, passes=3)
    pipeline = (
        Pipeline(source)
        .map(scale_in_place)
        .tokenize(tokenizer=tokenizer, special_tokens="none")
        .pack_flat(64, "best_fit", max_sequences_per_bin=1)
        .batch(1)
    )
    texts = [tokenizer.decode(b.input_ids[0, : b.num_tokens].tolist()) for b in pipeline]
    assert texts == [f"doc {i} 2" for i in range(4)] * 3
    assert embeddings[0].tolist() == [1.0, 1.0, 1.0]


def test_a_map_returning_no_dict_on_a_row_names_the_row(tokenizer: Any) -> None:
    rows = [{"text": f"row {i}", "title": "t"} for i in range(12)]
    rows[7] = {"text": "row 7"}
    source = StaticMixtureWorkSource([Dataset.from_dict("notes", rows)], seed=0)
    pipeline = Pipeline(source).map(_drops_notes_without_title).tokenize(tokenizer=tokenizer)
    with pytest.raises(DataError, match=r"must return a dict, got NoneType") as caught:
        list(pipeline.pack_flat(32).batch(2))
    assert (caught.value.dataset, caught.value.row) == ("notes", 7)


@pytest.mark.parametrize(
    ("op", "raised", "runner"),
    [
        ("map", "KeyError: 'title'", "threads"),
        ("filter", "ValueError: invalid literal", "threads"),
        ("map", "KeyError: 'title'", "processes"),  # the DataError crosses the process
    ],
)
def test_a_user_function_failing_on_a_row_names_the_row(
    tokenizer: Any, runner: str, op: str, raised: str
) -> None:
    rows = [{"text": f"row {i}", "title": "t", "limit": "9"} for i in range(12)]
    rows[7] = {"text": "row 7", "limit": "nine"}  # no title, and a limit that is no number
    source = StaticMixtureWorkSource([Dataset.from_dict("notes", rows)], seed=0)
    pipeline = Pipeline(source)
    pipeline = pipeline.map(_needs_title) if op == "map" else pipeline.filter(_short)
    pipeline = pipeline.tokenize(tokenizer=tokenizer, runner=runner, parallelism=2)
    with pytest.raises(DataError, match=f"{op} '.*' raised {raised}") as caught:
        list(pipeline.pack_flat(32).batch(2))
    assert (caught.value.dataset, caught.value.row) == ("notes", 7)


class _KeepEvery:
    """A stateful filter that keeps every document (its state: how many it saw)."""

    name = "keep_every"

    def __init__(self) -> None:
        self.seen = 0

    def keep(self, tokens: Any, source: int) -> bool:
        self.seen += 1
        return True

    def state_dict(self) -> dict[str, Any]:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seen = state["seen"]


def test_an_iteration_ended_or_made_stale_lets_its_workers_and_read_ahead_go(
    tokenizer: Any,
) -> None:
    """An iterator made stale by a newer one kept its pool of workers (and, with processes,
    the processes and the chain's file) until the caller dropped it; an ended iteration kept
    every chunk it had read ahead, tokenized, for as long as the pipeline lived."""
    import threading
    import time

    def docs_threads(at_most: int) -> int:  # a shut-down pool's threads end once idle
        deadline = time.monotonic() + 10
        while True:
            alive = sum(t.name.startswith("zephon-docs") for t in threading.enumerate())
            if alive <= at_most or time.monotonic() > deadline:
                return alive
            time.sleep(0.02)

    pipeline = small_pipeline(tokenizer, lanes=2, parallelism=2, prefetch=0)
    before = docs_threads(10**6)
    stale = iter(pipeline)
    next(stale)
    live = iter(pipeline)
    next(live)  # the stale iterator is still held
    assert docs_threads(before + 2) == before + 2  # the live iteration's pool alone
    with pytest.raises(RuntimeError, match="stale"):
        next(stale)
    del live
    runtime = pipeline._runtime
    assert runtime is not None
    assert runtime.nodes == [] and all(not reader._futures for reader in runtime.readers)
    assert docs_threads(before) == before
    assert pipeline.stats()["batches"] == 1  # the counters stay


@pytest.mark.parametrize(
    "recipe", ["plain", "filter", "stateful_filter", "pretokenized", "processes"]
)
def test_a_finished_pipeline_leaves_no_reference_cycle(tokenizer: Any, recipe: str) -> None:
    """The readers held the packer (told it of filtered rows) and their own barren runs held
    them: each pipeline, its decoded row groups with it, lived on until the garbage collector
    ran, so a process building pipelines one after another read into fresh memory (Parquet
    token data at half speed from the second pipeline on)."""
    import gc
    import time

    from zephon_torch.ops.stateful import StatefulFilter

    class Keep(_KeepEvery, StatefulFilter):
        pass

    texts = prose_documents(40, seed=3)
    ids = [list(range(1, 2 + i % 7)) for i in range(40)]
    dataset = Dataset.from_dict("d", {"text": texts, "input_ids": ids}, shard_size=8)
    pipeline = Pipeline(StaticMixtureWorkSource([dataset], seed=1)).options(canonical_replicas=2)
    if recipe == "filter":
        pipeline = pipeline.filter(lambda row: True, name="all")
    if recipe == "pretokenized":
        pipeline = pipeline.pretokenized("input_ids")
    elif recipe == "processes":  # each chunk's future settles another (Runner)
        pipeline = pipeline.tokenize(tokenizer=tokenizer, runner="processes", parallelism=1)
    else:
        pipeline = pipeline.tokenize(tokenizer=tokenizer)
    if recipe == "stateful_filter":
        pipeline = pipeline.stateful_filter(lambda lane: Keep())
    pipeline = pipeline.pack_flat(32).batch(2)
    # garbage another test left settles first: a collection can finalize a closed S3 client,
    # which frees its own cycles a moment later on fsspec's event loop, in this test's time
    quiet = 0
    for _ in range(50):  # until two collections a moment apart find nothing
        quiet = quiet + 1 if gc.collect() == 0 else 0
        if quiet == 2:
            break
        time.sleep(0.05)
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        assert sum(batch.num_tokens for batch in pipeline) > 0
        del pipeline
        gc.collect()
        cyclic = sorted({type(o).__name__ for o in gc.garbage})
    finally:
        gc.garbage.clear()
        gc.set_debug(0)
        gc.enable()
    assert cyclic == []
