"""Pre-tokenized input: token ids from a field pack exactly like tokenizing the text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import prose_documents
from tests.helpers import assert_resumes_at_every_step, keys
from zephon_torch import DataError, Pipeline
from zephon_torch.io import Dataset
from zephon_torch.ops import _copy
from zephon_torch.ops.pretokenized import with_eos
from zephon_torch.work import StaticMixtureWorkSource, TokenEstimation


@pytest.fixture(params=["compiled", "numpy"])
def copy(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches copied by the compiled module (which checks the ids as it copies), or by numpy
    (``IdCheck`` then reads the batch): the same batches and the same errors."""
    if request.param == "numpy":
        monkeypatch.setattr(_copy, "_native", None)
    else:
        assert _copy._native is not None, "zephon_torch._native was not built"


def sources(tokenizer: Any) -> list[Dataset]:
    out = []
    for name, seed in (("a", 1), ("b", 2)):
        texts = prose_documents(30, seed=seed, max_words=120)
        ids = [
            np.asarray(tokenizer.encode(t, add_special_tokens=False).ids, dtype=np.int32)
            for t in texts
        ]
        out.append(Dataset.from_dict(name, {"text": texts, "ids": ids}, shard_size=7))
    return out


def recipe(datasets: list[Dataset]) -> Pipeline:
    source = StaticMixtureWorkSource(
        datasets, {"a": 2, "b": 1}, seed=5, token_estimation=TokenEstimation()
    )
    return Pipeline(source).options(canonical_replicas=2)


@pytest.mark.usefixtures("copy")
def test_token_ids_in_a_field_give_the_batches_of_tokenizing_the_text(tokenizer: Any) -> None:
    datasets = sources(tokenizer)
    eos = tokenizer.token_to_id("<|endoftext|>")
    tokenized = recipe(datasets).tokenize(tokenizer=tokenizer).pack_flat(40, "best_fit").batch(2)
    given = (
        recipe(datasets).pretokenized("ids", eos_token_id=eos).pack_flat(40, "best_fit").batch(2)
    )
    assert keys(given) == keys(tokenized)


@pytest.mark.usefixtures("copy")
def test_pretokenized_pipelines_resume_at_every_step(tokenizer: Any) -> None:
    datasets = sources(tokenizer)
    assert_resumes_at_every_step(
        lambda: recipe(datasets).pretokenized("ids").pack_flat(32).batch(2)
    )


def test_lists_of_ints_are_accepted_and_bad_ids_are_refused_by_row() -> None:
    good = Dataset.from_dict("d", {"ids": [[1, 2, 3], [4, 5]]})
    batch = next(iter(recipe_one(good).pretokenized("ids").pack_flat(8).batch(1)))
    assert batch.input_ids[0, :5].tolist() == [1, 2, 3, 4, 5]
    bad = Dataset.from_dict("d", {"ids": [[1, 2], [3, -1]]})
    with pytest.raises(DataError, match=r"row 1: field 'ids' holds token id -1; ids must lie in"):
        list(recipe_one(bad).pretokenized("ids").pack_flat(8).batch(1))
    text = Dataset.from_dict("d", {"ids": ["not ids"]})
    with pytest.raises(DataError, match="must hold a 1-D list of integer token ids"):
        list(recipe_one(text).pretokenized("ids").pack_flat(8).batch(1))
    floats = Dataset.from_dict("d", {"ids": [np.array([1.0, 2.0], dtype=np.float32)]})
    with pytest.raises(DataError, match=r"got ndarray of shape \(2,\) and dtype float32"):
        list(recipe_one(floats).pretokenized("ids").pack_flat(8).batch(1))
    # a null id (a Parquet list read without token_columns): said, not "dtype object"
    nulls = Dataset.from_dict("d", {"ids": [[1, 2], [3, None, 5]]})
    with pytest.raises(DataError, match=r"row 1: .*its id at position 1 is null \(None\)"):
        list(recipe_one(nulls).pretokenized("ids").pack_flat(8).batch(1))


def test_a_boolean_among_the_ids_of_a_json_list_is_refused_by_row(tmp_path: Any) -> None:
    # numpy reads [5, true, 7] as [5, 1, 7]: a damaged row would pass as the id 1
    path = tmp_path / "part-0.jsonl"
    path.write_text('{"ids": [4, 5]}\n{"ids": [5, true, 7]}\n')
    for projected in (None, ["ids"]):  # read as rows, or as a token column
        dataset = Dataset.from_path("d", path, token_columns=projected)
        with pytest.raises(DataError, match=r"part-0.jsonl', row 1: .*item 1 is the boolean True"):
            list(recipe_one(dataset).pretokenized("ids").pack_flat(8).batch(1))
    path.write_text('{"ids": [4, 5]}\n{"ids": [1, 0]}\n')  # the ids 1 and 0 are fine
    batch = next(
        iter(recipe_one(Dataset.from_path("d", path)).pretokenized("ids").pack_flat(8).batch(1))
    )
    assert batch.input_ids[0, :4].tolist() == [4, 5, 1, 0]


def recipe_one(dataset: Dataset) -> Pipeline:
    return Pipeline(StaticMixtureWorkSource([dataset], shuffle=False))


def test_every_runner_gives_the_same_batches_and_auto_reads_mapped_data_inline(
    tokenizer: Any, tmp_path: Any
) -> None:
    from zephon_torch._token_stage import pretokenized_runner

    datasets = sources(tokenizer)
    runs = {
        runner: keys(recipe(datasets).pretokenized("ids", runner=runner).pack_flat(32).batch(2))
        for runner in ("inline", "threads", "auto")
    }
    assert len(runs["inline"]) > 10
    assert runs["threads"] == runs["inline"] == runs["auto"]
    # "auto": in-memory and .npy data inline; Parquet on threads
    assert pretokenized_runner(recipe(datasets).pretokenized("ids")) == "inline"
    mapped = recipe(datasets).map(dict).pretokenized("ids")
    assert pretokenized_runner(mapped) == "threads"  # user functions: as with tokenize
    np.save(tmp_path / "part-0.npy", np.arange(12, dtype=np.int32).reshape(3, 4))
    mapped = Dataset.from_path("npy", tmp_path / "part-0.npy")
    assert pretokenized_runner(recipe_one(mapped).pretokenized("input_ids")) == "inline"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"ids": [[1, 2], [3]]}), tmp_path / "t.parquet")
    columnar = Dataset.from_path("pq", tmp_path / "t.parquet", token_columns=["ids"])
    assert pretokenized_runner(recipe_one(columnar).pretokenized("ids")) == "threads"
    assert pretokenized_runner(recipe_one(columnar).pretokenized("ids", runner="inline")) == (
        "inline"
    )


def test_bad_runner_settings_are_refused_when_the_recipe_is_built() -> None:
    from zephon_torch import ConfigError

    pipeline = recipe_one(Dataset.from_dict("d", {"ids": [[1]]}))
    for runner in ("auto", "inline", "threads"):
        with pytest.raises(ConfigError, match=r"`parallelism` must be a positive int, got 0"):
            pipeline.pretokenized("ids", parallelism=0, runner=runner)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"`runner` must be one of"):
        pipeline.pretokenized("ids", runner="fibers")  # type: ignore[arg-type]


def test_an_inline_runner_raises_bad_ids_where_the_document_is_read() -> None:
    bad = Dataset.from_dict("d", {"ids": [[1, 2], [3, 4], [5, -6]]}, shard_size=2)
    pipeline = recipe_one(bad).pretokenized("ids", runner="inline").pack_flat(2).batch(1)
    with pytest.raises(DataError, match=r"dataset 'd'.*row 0: field 'ids' holds token id -6"):
        list(pipeline)


@pytest.mark.parametrize(
    ("stored", "shown"),
    [
        (np.array([1, -7], dtype=np.int32), "-7"),
        (np.array([1, -7], dtype=np.int16), "-7"),  # narrow but signed: still checked
        (np.array([1, -7], dtype=np.int8), "-7"),
        (np.array([1, 2**31], dtype=np.int64), str(2**31)),
        (np.array([1, 2**32], dtype=np.int64), str(2**32)),  # both int32 halves >= 0
        (np.array([1, 2**32 - 1], dtype=np.uint32), str(2**32 - 1)),
        (np.array([1, 2**64 - 3], dtype=np.uint64), str(2**64 - 3)),  # -3 in int64
    ],
)
@pytest.mark.parametrize("how", ["columns", "bins", "mapped"])
@pytest.mark.usefixtures("copy")
def test_an_id_outside_int32_is_refused_naming_its_document_on_every_path(
    stored: Any, shown: str, how: str
) -> None:
    docs = [np.arange(1, 6, dtype=stored.dtype) for _ in range(9)]
    docs[7] = np.concatenate([docs[7], stored])  # shard 1 (of 4 rows each), row 3
    pipeline = recipe_one(Dataset.from_dict("d", {"ids": docs}, shard_size=4))
    if how == "mapped":
        pipeline = pipeline.map(dict)  # the per-document chain, not columns
    pipeline = pipeline.pretokenized("ids")
    packed = pipeline.pack_flat(4, "best_fit" if how == "bins" else "wrap").batch(2)
    where = rf"shard 'memory://d/1', row 3: field 'ids' holds token id {shown}; ids must lie in"
    with pytest.raises(DataError, match=where):
        list(packed)
    good = [np.arange(1, 6, dtype=stored.dtype)] * 3
    ok = recipe_one(Dataset.from_dict("d", {"ids": good})).pretokenized("ids").pack_flat(5)
    assert [b.input_ids.tolist() for b in ok.batch(1)] == [[[1, 2, 3, 4, 5]]] * 3


@pytest.mark.parametrize("packer", ["wrap", "best_fit"])
@pytest.mark.usefixtures("copy")
def test_a_bad_id_in_the_first_piece_of_a_document_cut_at_a_batch_end_names_it(
    packer: str,
) -> None:
    """The documents before it fill the batch but 5 tokens: its first 5 (the bad id among
    them) end the batch, its rest begins the next one."""
    docs = [np.arange(1, 6, dtype=np.int32) for _ in range(9)]
    docs[7] = np.array([1, 2, 3, -9, 5, 6, 7], dtype=np.int32)  # shard 1, row 3: tokens 35..
    pipeline = recipe_one(Dataset.from_dict("d", {"ids": docs}, shard_size=4))
    packed = pipeline.pretokenized("ids").pack_flat(4, packer).batch(2)  # 8 tokens a batch
    where = r"shard 'memory://d/1', row 3: field 'ids' holds token id -9; ids must lie in"
    with pytest.raises(DataError, match=where):
        list(packed)


@pytest.mark.parametrize("dtype", [np.uint8, np.uint16, np.int32, np.int64])
@pytest.mark.parametrize("how", ["columns", "bins", "mapped"])
@pytest.mark.usefixtures("copy")
def test_an_id_past_vocab_size_is_refused_naming_its_document(dtype: Any, how: str) -> None:
    """An id past the model's vocabulary went into batches, to fail in the embedding naming
    no dataset, shard or row (review H, F8). uint8 and uint16 ids, which skip the int32
    check, are checked against a vocabulary smaller than their range."""
    vocab = 200 if dtype == np.uint8 else 50_000
    docs = [np.arange(1, 6, dtype=dtype) for _ in range(9)]
    docs[6] = np.array([1, vocab], dtype=dtype)  # shard 1 (of 4 rows each), row 2
    pipeline = recipe_one(Dataset.from_dict("d", {"ids": docs}, shard_size=4))
    if how == "mapped":
        pipeline = pipeline.map(dict)
    checked = pipeline.pretokenized("ids", vocab_size=vocab)
    packed = checked.pack_flat(4, "best_fit" if how == "bins" else "wrap").batch(2)
    where = (
        rf"shard 'memory://d/1', row 2: field 'ids' holds token id {vocab}; ids must lie in "
        rf"\[0, {vocab} \(vocab_size\)\)"
    )
    with pytest.raises(DataError, match=where) as caught:
        list(packed)
    # a wrong vocabulary, not a bad row: skipping is neither done nor offered (a trial
    # followed the offer, and the relaunched job failed the same way)
    assert not caught.value.rows_fault
    assert str(caught.value).endswith("bad_rows='skip' does not skip ids out of range)")
    with pytest.raises(DataError, match=where):
        list(checked.options(bad_rows="skip").pack_flat(4).batch(2))
    wide = pipeline.pretokenized("ids", vocab_size=vocab + 1).pack_flat(4).batch(2)
    assert sum(b.num_tokens for b in wide) == 8 * 5 + 2  # the largest id fits
    # the recipe is the same: vocab_size changes no data, so it is not in the state
    assert checked.pack_flat(4).batch(2).fingerprint() == wide.fingerprint()


def test_eos_and_pad_ids_past_vocab_size_are_config_errors() -> None:
    from zephon_torch import ConfigError

    pipeline = recipe_one(Dataset.from_dict("d", {"ids": [[1, 2]]}))
    with pytest.raises(ConfigError, match=r"`eos_token_id` 9 lies outside the vocabulary: "
                       r"`vocab_size` is 9"):  # fmt: skip
        pipeline.pretokenized("ids", eos_token_id=9, vocab_size=9)
    padded = pipeline.pretokenized("ids", vocab_size=9).pack_flat(4, pad_token_id=10).batch(1)
    with pytest.raises(ConfigError, match=r"`pad_token_id` 10 lies outside the vocabulary"):
        list(padded)
    for bad in (0, -1, 2**31 + 1, 2.0, True):
        with pytest.raises(ConfigError, match=r"`vocab_size` must"):
            pipeline.pretokenized("ids", vocab_size=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("how", ["columns", "bins"])
@pytest.mark.usefixtures("copy")
def test_uint16_ids_need_no_check_but_a_wider_document_among_them_is_still_checked(
    how: str,
) -> None:
    docs = [np.array([65535, 0, 7], dtype=np.uint16), np.array([3, 4], dtype=np.uint8)] * 4
    packer = "best_fit" if how == "bins" else "wrap"
    ok = recipe_one(Dataset.from_dict("d", {"ids": docs})).pretokenized("ids")
    delivered = [t for b in ok.pack_flat(5, packer).batch(1) for t in b.input_ids[0].tolist()]
    assert sorted(t for t in delivered if t != 0) == sorted([65535, 7, 3, 4] * 4)
    docs[5] = np.array([3, -2], dtype=np.int32)
    mixed = recipe_one(Dataset.from_dict("d", {"ids": docs})).pretokenized("ids")
    with pytest.raises(DataError, match=r"row 5: field 'ids' holds token id -2"):
        list(mixed.pack_flat(5, packer).batch(1))
    # an EOS id appended in the stored type where it fits, else in int32: never wrapped
    cases = [(65535, np.uint16, np.uint16), (200, np.uint8, np.uint8)]
    cases += [(300, np.uint8, np.int32), (65536, np.uint16, np.int32)]
    for eos, kind, dtype in cases:
        stored = [np.array([5, 6], dtype=kind)]
        with_end = recipe_one(Dataset.from_dict("d", {"ids": stored * 3})).pretokenized(
            "ids", eos_token_id=eos
        )
        rows = [b.input_ids[0].tolist() for b in with_end.pack_flat(3, packer).batch(1)]
        assert rows == [[5, 6, eos]] * 3
        assert with_eos(stored[0], eos).dtype == dtype


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.int32, np.uint32, np.int64, np.uint64])
def test_the_eos_id_is_appended_whatever_the_stored_integer_type(dtype: Any) -> None:
    docs = [np.array([1, 2], dtype=dtype), np.array([3], dtype=dtype)]
    pipeline = recipe_one(Dataset.from_dict("d", {"ids": docs})).pretokenized(
        "ids", eos_token_id=300
    )
    batches = list(pipeline.pack_flat(5).batch(1))
    assert [b.input_ids.tolist() for b in batches] == [[[1, 2, 300, 3, 300]]]


def test_eos_and_pad_ids_outside_int32_are_refused_when_the_recipe_is_built() -> None:
    from zephon_torch import ConfigError

    pipeline = recipe_one(Dataset.from_dict("d", {"ids": [[1]]}))
    numpy_ids = pipeline.pretokenized("ids", eos_token_id=np.int64(5)).pack_flat(
        4,
        pad_token_id=np.int32(7),  # type: ignore[arg-type]
    )
    assert [b.input_ids.tolist() for b in numpy_ids.batch(1)] == [[[1, 5, 7, 7]]]
    assert numpy_ids.batch(1).fingerprint()  # plain ints: the recipe serialises
    for bad in (-1, 2**31, 1.0, True):
        with pytest.raises(
            ConfigError, match=r"`eos_token_id` must be a token id in \[0, 2\*\*31\)"
        ):
            pipeline.pretokenized("ids", eos_token_id=bad)  # type: ignore[arg-type]
        with pytest.raises(
            ConfigError, match=r"`pad_token_id` must be a token id in \[0, 2\*\*31\)"
        ):
            pipeline.pretokenized("ids").pack_flat(4, pad_token_id=bad)  # type: ignore[arg-type]


def test_inline_token_columns_read_further_ahead_only_when_they_hold_views() -> None:
    ids = [np.arange(i + 1, dtype=np.int32) for i in range(40)]
    base = recipe_one(Dataset.from_dict("d", {"ids": ids}))
    for eos, runner, growth in ((None, "inline", 256), (0, "inline", 8), (None, "threads", 8)):
        pipeline = base.pretokenized("ids", eos_token_id=eos, runner=runner).pack_flat(8).batch(1)
        next(iter(pipeline))  # copies (an EOS appended) or another thread: the usual 8x
        assert pipeline._runtime is not None
        assert pipeline._runtime.readers[0]._growth == growth


def test_chunks_of_views_grow_to_about_a_token_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    from zephon_torch.ops import read
    from zephon_torch.work.pointers import PointerLayout

    monkeypatch.setattr(read, "_VIEW_TOKENS", 400)  # 100 documents of 4 tokens
    counts: list[int] = []
    span = PointerLayout.span

    def recorded(self: PointerLayout, **where: int) -> Any:
        counts.append(where["count"])
        return span(self, **where)

    monkeypatch.setattr(PointerLayout, "span", recorded)
    ids = [np.full(4, i, dtype=np.int32) for i in range(1000)]
    pipeline = recipe_one(Dataset.from_dict("d", {"ids": ids})).pretokenized("ids")
    batches = list(pipeline.pack_flat(8).batch(2))
    assert sum(b.num_tokens for b in batches) == 4000
    # doubling from chunk_docs while no chunk was returned yet (those read ahead at the
    # start), then held at the budget's 100 documents of 4 tokens
    chunk_docs, held = counts[0], counts.index(100)
    assert counts[:held] == [chunk_docs * 2**i for i in range(held)]
    assert set(counts[held:-1]) == {100} and 0 < counts[-1] <= 100
    assert sum(counts) == 1000


@pytest.mark.parametrize("runner", ["inline", "threads", "processes"])
def test_stats_time_the_token_columns_reading_on_every_runner(runner: str) -> None:
    ids = [np.arange(i % 7 + 1, dtype=np.int32) for i in range(30)]
    pipeline = (
        recipe_one(Dataset.from_dict("d", {"ids": ids}, shard_size=8))
        .pretokenized("ids", runner=runner, parallelism=1)  # type: ignore[arg-type]
        .pack_flat(8)
        .batch(2)
    )
    batches = list(pipeline)
    assert sum(b.num_tokens for b in batches) == sum(len(i) for i in ids)
    ops = pipeline.stats()["operators"]
    if runner == "processes":  # worker processes keep their own counters: none here
        assert ops is None
        return
    assert set(ops) == {"fetch", "pretokenized"}
    assert ops["fetch"]["documents"] == ops["pretokenized"]["documents"] == 30


def test_a_reader_s_chunk_count_stops_once_chunks_stop_growing() -> None:
    """Every chunk raised 2 to the number of chunks read so far: an integer of one bit per
    chunk, made at each chunk (3.7 ms a chunk after a million, 13.6 after four)."""
    docs = [[i % 100 + 1] * 3 for i in range(60_000)]
    source = StaticMixtureWorkSource([Dataset.from_dict("d", {"ids": docs})], shuffle=False)
    for eos in (None, 7):  # chunks of views grow to 256x, chunks of copies to 8x
        pipeline = Pipeline(source).pretokenized("ids", eos_token_id=eos).pack_flat(16).batch(4)
        batches = list(pipeline)
        assert sum(b.num_tokens for b in batches) == 60_000 * (3 if eos is None else 4)
        assert pipeline._runtime is not None
        [reader] = pipeline._runtime.readers
        assert reader._submitted == reader._growth.bit_length()


def test_a_finished_or_left_iteration_keeps_no_chunk_of_documents() -> None:
    """The runtime stays for `stats()`; its readers kept their last chunk, an inline reader's
    views of decoded shards reaching millions of tokens, until the next iteration."""
    docs = [[i % 100 + 1] * 3 for i in range(5_000)]
    source = StaticMixtureWorkSource([Dataset.from_dict("d", {"ids": docs})], shuffle=False)
    pipeline = Pipeline(source).pretokenized("ids").pack_flat(16).batch(4)
    for batch_number, _ in enumerate(pipeline):
        if batch_number == 3:
            assert pipeline._runtime is not None
            assert len(pipeline._runtime.readers[0]._chunk) > 0
            break
    assert pipeline._runtime is not None
    assert [len(reader._chunk) for reader in pipeline._runtime.readers] == [0]
    assert pipeline.stats()["tokens"] > 0


@pytest.mark.parametrize("token_columns", [None, ["ids"]])
def test_a_jsonl_id_past_int64_is_named_as_written(tmp_path: Path, token_columns: Any) -> None:
    """With `token_columns`, JSONL ids were made int64: 2**64 - 1 was refused as id -1."""
    (tmp_path / "a.jsonl").write_text('{"ids": [1]}\n{"ids": [3, 18446744073709551615]}\n')
    dataset = Dataset.from_path("u", tmp_path, token_columns=token_columns)
    pipeline = recipe_one(dataset).pretokenized("ids").pack_flat(2).batch(1)
    with pytest.raises(DataError, match=r"row 1: field 'ids' holds token id 18446744073709551615;"):
        list(pipeline)
    for ids, bad in (("2, 18446744073709551616", 2**64), ("2, -1, 9223372036854775808", -1)):
        (tmp_path / "a.jsonl").write_text(f'{{"ids": [1]}}\n{{"ids": [{ids}]}}\n')
        dataset = Dataset.from_path("u", tmp_path, token_columns=token_columns)
        pipeline = recipe_one(dataset).pretokenized("ids").pack_flat(2).batch(1)
        with pytest.raises(DataError, match=rf"row 1: .*its id {bad} is no token id"):
            list(pipeline)
    # numpy integers among Python ones (a `map`'s output, say) are ids alike
    wide = Dataset.from_dict("w", {"ids": [[np.int64(1), 2**64 - 1]]})
    with pytest.raises(DataError, match=r"holds token id 18446744073709551615;"):
        list(recipe_one(wide).pretokenized("ids").pack_flat(2).batch(1))
