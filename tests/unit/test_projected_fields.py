"""A dataset opened with `columns=` must keep the fields the pipeline reads: the token field and
payload fields are checked when the stage is added, not found missing row by row."""

from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon_torch import ConfigError, DataError, Pipeline
from zephon_torch._token_stage import read_datasets
from zephon_torch.io import Dataset
from zephon_torch.io._narrowing import NarrowedOrWhole
from zephon_torch.work import StaticMixtureWorkSource


def _pipeline(*datasets: Dataset) -> Pipeline:
    return Pipeline(StaticMixtureWorkSource(list(datasets), seed=0))


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    jsonl = tmp_path / "text.jsonl"
    jsonl.write_text("".join(json.dumps({"id": i, "text": f"row {i}"}) + "\n" for i in range(8)))
    parquet = tmp_path / "ids.parquet"
    ids = pa.array([list(range(i + 1)) for i in range(8)], pa.list_(pa.int32()))
    pq.write_table(pa.table({"id": list(range(8)), "ids": ids}), parquet)
    return jsonl, parquet


def test_a_token_field_the_columns_leave_out_is_refused_when_the_stage_is_added(
    files: tuple[Path, Path], tokenizer: Any
) -> None:
    """Before, every row failed at the first batch ("row 0: field 'text' is missing"),
    blamed on the row rather than on `columns=` (a fresh-user trial)."""
    jsonl, parquet = files
    kept = Dataset.from_path("all", jsonl)
    narrow = Dataset.from_path("narrow", jsonl, columns=["id"])
    assert (kept.columns, narrow.columns) == (None, ("id",))
    with pytest.raises(
        ConfigError,
        match=r"dataset 'narrow' was opened with columns=\['id'\], which leaves out 'text', "
        r"the field `tokenize` reads: add it to `columns`",
    ):
        _pipeline(kept, narrow).tokenize(tokenizer=tokenizer)
    ids = Dataset.from_path("ids", parquet, columns=["id"])
    with pytest.raises(ConfigError, match=r"leaves out 'ids', the field `pretokenized` reads"):
        _pipeline(ids).pretokenized("ids")
    # a map may write the field: not checked after one
    _pipeline(narrow).map(lambda row: {"text": str(row["id"])}).tokenize(tokenizer=tokenizer)
    batch = next(iter(_pipeline(kept).tokenize(tokenizer=tokenizer).pack_flat(8).batch(1)))
    assert batch.num_tokens == 8


def test_a_payload_field_the_columns_leave_out_is_refused(files: tuple[Path, Path]) -> None:
    _, parquet = files
    ids = Dataset.from_path("ids", parquet, columns=["ids"], token_columns=["ids"])
    tokens = _pipeline(ids).pretokenized("ids")
    with pytest.raises(ConfigError, match=r"leaves out 'id', the field `payload_fields` reads"):
        tokens.pack_sequences(16, payload_fields=["id"])
    both = Dataset.from_path("both", parquet, columns=["id", "ids"], token_columns=["ids"])
    batch = next(
        iter(_pipeline(both).pretokenized("ids").pack_sequences(16, payload_fields=["id"]).batch(1))
    )
    assert batch.payloads is not None and np.all(batch.input_ids >= 0)


def _unreadable_column() -> pa.Array:
    """Values pyarrow cannot give as Python ones without pandas (a map of nanosecond times):
    a row group holding them fails to decode whole."""
    return pa.array([[("k", 1001)]] * 8, pa.map_(pa.string(), pa.timestamp("ns")))


def _batches(pipeline: Pipeline) -> list[tuple[bytes, Any]]:
    return [(b.input_ids.tobytes(), b.payloads) for b in pipeline]


def test_a_recipe_without_map_or_filter_reads_only_its_fields(
    tmp_path: Path, tokenizer: Any
) -> None:
    """Rows were decoded whole, every column, though the recipe reads one: a column of another
    use that does not decode (or is merely large) stopped or slowed the run. With a `map`,
    which may read any field, every column is still read."""
    texts = [f"row {i} " + "word " * (i * 5) for i in range(8)]
    pq.write_table(
        pa.table({"id": list(range(8)), "text": texts, "seen": _unreadable_column()}),
        tmp_path / "a.parquet",
    )
    dataset = Dataset.from_path("d", tmp_path / "a.parquet")

    def recipe(pipeline: Pipeline) -> Pipeline:
        return pipeline.tokenize(tokenizer=tokenizer).pack_sequences(64, payload_fields=["id"])

    read = recipe(_pipeline(dataset)).batch(2)
    assert [d.columns for d in read_datasets(read)] == [("text", "id")]
    assert "dataset 'd' reads columns ['text', 'id'] only (no map" in read.explain()
    narrowed = Dataset.from_path("d", tmp_path / "a.parquet", columns=["text", "id"])
    got = _batches(read)
    assert got == _batches(recipe(_pipeline(narrowed)).batch(2)) and got
    mapped = recipe(_pipeline(dataset).map(dict, name="same")).batch(2)
    assert read_datasets(mapped) == (dataset,)
    with pytest.raises(DataError, match=r"cannot decode row group 0: .*Nanosecond"):
        list(mapped)


def test_a_pretokenized_list_column_is_read_as_a_token_column(tmp_path: Path) -> None:
    """Without `token_columns=`, a Parquet list of ids came back as one Python int an id
    (about 3x slower through the pipeline, measured); the pipeline now asks for it, and for
    no other column. The batches are those of the dataset opened with both, also in
    DataLoader workers, which get the pipeline's datasets as it reads them."""
    from zephon_torch.torch import DataLoader

    ids = [list(range(i, i + 3 + i % 5)) for i in range(8)]
    table = pa.table({"ids": pa.array(ids, pa.list_(pa.int32())), "seen": _unreadable_column()})
    pq.write_table(table, tmp_path / "a.parquet")
    plain = Dataset.from_path("d", tmp_path / "a.parquet")
    recipe = _pipeline(plain).pretokenized("ids").pack_flat(4).batch(2)
    (read,) = read_datasets(recipe)
    assert (read.columns, plain.columns) == (("ids",), None)
    assert "reads columns ['ids'] only and 'ids' as token ids" in recipe.explain()
    named = Dataset.from_path("d", tmp_path / "a.parquet", columns=["ids", "seen"])
    told = _pipeline(named).pretokenized("ids").pack_flat(4).batch(2).explain()
    assert "dataset 'd' reads 'ids' as token ids (no map" in told  # its columns as given
    assert isinstance(read.read_rows(0, [1])[0]["ids"], np.ndarray)
    by_hand = Dataset.from_path("d", tmp_path / "a.parquet", columns=["ids"], token_columns=["ids"])
    expected = _batches(_pipeline(by_hand).pretokenized("ids").pack_flat(4).batch(2))
    assert _batches(copy.deepcopy(recipe)) == expected
    loader = DataLoader(recipe.options(canonical_replicas=2), num_workers=2)
    by_hand = _pipeline(by_hand).options(canonical_replicas=2).pretokenized("ids")
    wanted = [k for k, _ in _batches(by_hand.pack_flat(4).batch(2))]
    assert [item["input_ids"].numpy().tobytes() for item in loader] == wanted


def test_columns_given_by_hand_are_kept_and_a_missing_field_names_the_shard(
    tmp_path: Path, tokenizer: Any
) -> None:
    """`columns=` stays as given (the pipeline narrows only a dataset opened with all); a
    shard without the field read is refused naming it and its columns, where each of its rows
    had been refused as that row's fault."""
    pq.write_table(pa.table({"text": ["a b", "c"], "id": [1, 2]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"body": ["d e"], "id": [3]}), tmp_path / "b.parquet")
    kept = Dataset.from_path("d", tmp_path / "a.parquet", columns=["id", "text"])
    pipeline = _pipeline(kept).tokenize(tokenizer=tokenizer).pack_flat(4).batch(1)
    assert [d.columns for d in read_datasets(pipeline)] == [("id", "text")]
    both = Dataset.from_path("d", tmp_path)
    pipeline = _pipeline(both).tokenize(tokenizer=tokenizer).pack_flat(4).batch(1)
    with pytest.raises(DataError, match=r"b\.parquet'.*has no column 'text'; its columns are"):
        list(pipeline)


def test_under_skip_a_shard_lacking_a_field_is_read_whole_and_a_payload_of_ids_too(
    tmp_path: Path, tokenizer: Any
) -> None:
    """Narrowed, a shard lacking the field read fails at its open, as no row's fault, so
    `bad_rows="skip"` would not skip its rows: under skip such a shard is read whole, each of
    its rows skipped (before, every dataset of such a recipe was read whole, every column
    decoded). A payload of the token field kept the ids as a read-only array where they had
    been a list (a review)."""
    pq.write_table(pa.table({"text": ["a b", "c d"], "id": [1, 2]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"body": ["e f"], "id": [3]}), tmp_path / "b.parquet")
    both = Dataset.from_path("d", tmp_path)
    skipping = _pipeline(both).options(bad_rows="skip").tokenize(tokenizer=tokenizer)
    pipeline = skipping.pack_flat(4).batch(1)
    (read,) = read_datasets(pipeline)
    assert isinstance(read, NarrowedOrWhole) and read.columns == ("text",)
    with pytest.warns(UserWarning, match=r"b\.parquet', row 0: field 'text' is missing"):
        list(pipeline)
    assert pipeline.stats()["skipped_documents"]["malformed"] == 1
    assert read._whole_shards == {1}  # a.parquet still read narrowed
    assert "(no map or filter reads the rows; under skip, a shard lacking them is read whole)" in (
        pipeline.explain()
    )
    ids = pa.array([[1, 2], [3, 4, 5]], pa.list_(pa.int32()))
    pq.write_table(pa.table({"ids": ids, "x": [0, 1]}), tmp_path / "ids.parquet")
    tokens = _pipeline(Dataset.from_path("i", tmp_path / "ids.parquet")).pretokenized("ids")
    packed = tokens.pack_sequences(8, payload_fields=["ids"]).batch(1)
    (read,) = read_datasets(packed)
    assert read.columns == ("ids",) and read._reader.projection.token_columns == ()
    payloads = [p for batch in packed for row in batch.payloads or [] for p in row]
    assert sorted(p["ids"] for p in payloads) == [[1, 2], [3, 4, 5]]


def test_a_run_stopped_by_a_shard_lacking_the_field_goes_on_with_skip_in_the_same_process(
    tmp_path: Path, tokenizer: Any
) -> None:
    """The README's way on after a bad row ended a run: the same recipe with
    `options(bad_rows="skip")`, from the last state. Made from the pipeline that raised, in the
    same process, the skipping one took over its narrowed readers, made for "raise", so the
    shard lacking the field ended this run too, where a recipe built afresh skips its rows."""
    pq.write_table(pa.table({"text": ["a b", "c d"], "id": [1, 2]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"body": ["e f"], "id": [3]}), tmp_path / "b.parquet")
    raising = _pipeline(Dataset.from_path("d", tmp_path)).tokenize(tokenizer=tokenizer)
    raising = raising.pack_flat(4).batch(1)
    with pytest.raises(DataError, match=r"b\.parquet': has no column 'text'"):
        list(raising)
    skipping = raising.options(bad_rows="skip")
    with pytest.warns(UserWarning, match=r"b\.parquet', row 0: field 'text' is missing"):
        got = [batch.input_ids.tobytes() for batch in skipping]
    assert skipping.stats()["skipped_documents"]["malformed"] == 1
    fresh = _pipeline(Dataset.from_path("d", tmp_path)).options(bad_rows="skip")
    fresh = fresh.tokenize(tokenizer=tokenizer).pack_flat(4).batch(1)
    with pytest.warns(UserWarning):
        assert got == [batch.input_ids.tobytes() for batch in fresh]


def _mismatched_shards(folder: Path) -> None:
    """Parquet shards of token ids in `ids`, among them one whose `ids` holds text and one
    without `ids`: each of their rows a row's fault when read whole."""
    folder.mkdir()
    for number in range(4):
        ids = pa.array([[number * 10 + i] * (i + 2) for i in range(5)], pa.list_(pa.int32()))
        pq.write_table(pa.table({"ids": ids, "n": range(5)}), folder / f"a{number}.parquet")
    pq.write_table(pa.table({"ids": ["x", "y"], "n": [0, 1]}), folder / "b.parquet")
    pq.write_table(pa.table({"other": [[1, 2]], "n": [0]}), folder / "c.parquet")


@pytest.mark.parametrize("where", ["local", "remote"])
def test_under_skip_narrowed_reading_gives_the_batches_skips_and_resumes_of_whole_rows(
    tmp_path: Path, where: str
) -> None:
    """Read narrowed (only `ids`, as a token column) with the mismatched shards read whole,
    a skipping recipe gives the batches and skip counts of one that reads every row whole
    (a `map` reads rows whole), and resumes at every step; locally and over a URL, whose
    reader re-raises a shard's error under its URL."""
    import uuid
    import warnings

    import fsspec

    from tests.helpers import assert_resumes_at_every_step, keys

    folder = tmp_path / "ids"
    _mismatched_shards(folder)
    path = str(folder)
    options: dict[str, Any] = {}
    if where == "remote":
        path = f"memory:///zt-{uuid.uuid4().hex[:8]}"
        fsspec.filesystem("memory").put(str(folder), path[len("memory://") :], recursive=True)
        options = {"io_options": {"cache": {"dir": str(tmp_path / "cache")}}}

    def build(whole: bool = False) -> Pipeline:
        dataset = Dataset.from_path("d", path, **options)
        pipeline = _pipeline(dataset).options(bad_rows="skip")
        if whole:
            pipeline = pipeline.map(dict)
        return pipeline.pretokenized("ids").pack_flat(8).batch(2)

    narrowed, whole = build(), build(whole=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = keys(narrowed)
        assert got == keys(whole) and len(got) > 3
        (read,) = read_datasets(narrowed)
        assert isinstance(read, NarrowedOrWhole) and read.token_columns == ("ids",)
        assert sorted(read.shards[s].path.rsplit("/", 1)[1] for s in read._whole_shards) == [
            "b.parquet",
            "c.parquet",
        ]
        skipped = narrowed.stats()["skipped_documents"]
        assert skipped == whole.stats()["skipped_documents"] and skipped["malformed"] == 3
        assert assert_resumes_at_every_step(build) == len(got)
    # as a DataLoader worker or a process runner gets it: still reading that shard whole
    bad = next(s for s in read._whole_shards if read.shards[s].path.endswith("b.parquet"))
    copy = pickle.loads(pickle.dumps(read))
    assert copy._whole_shards == read._whole_shards
    assert copy.read_rows(bad, [1]) == [{"ids": "y", "n": 1}]


def test_under_skip_an_mds_shard_lacking_the_field_has_its_rows_skipped(
    tmp_path: Path,
) -> None:
    """An MDS index lists every shard's columns, so the narrowed open checked them all and a
    shard lacking the field read (an index merged from two writes) ended a skipping run at its
    start, as no row's fault, where a recipe reading rows whole skips that shard's rows: the
    dataset is then read whole, with the batches and skips of such a recipe."""
    import warnings

    from tests.helpers import keys
    from tests.unit.io.test_io_formats_writers import write_mds

    folder = tmp_path / "merged"
    rows = [{"ids": np.arange(i, 2 * i + 2, dtype=np.int32)} for i in range(6)]
    write_mds(folder / "a", rows, {"ids": "ndarray:int32"})
    write_mds(folder / "b", [{"other": "x"}, {"other": "y"}], {"other": "str"})
    shards = []
    for part in ("a", "b"):  # as streaming's merge_index writes it
        for shard in json.loads((folder / part / "index.json").read_text())["shards"]:
            shard["raw_data"]["basename"] = f"{part}/{shard['raw_data']['basename']}"
            shards.append(shard)
    (folder / "index.json").write_text(json.dumps({"version": 2, "shards": shards}))

    def build(whole: bool = False) -> Pipeline:
        pipeline = _pipeline(Dataset.from_path("d", folder)).options(bad_rows="skip")
        if whole:
            pipeline = pipeline.map(dict)
        return pipeline.pretokenized("ids").pack_flat(8).batch(2)

    narrowed, whole = build(), build(whole=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = keys(narrowed)
        assert got == keys(whole) and len(got) > 1
    assert narrowed.stats()["skipped_documents"]["malformed"] == 2
    with pytest.raises(DataError, match=r"b/shard\.00000\.mds'.*has no column 'ids'"):
        list(_pipeline(Dataset.from_path("d", folder)).pretokenized("ids").pack_flat(8).batch(2))
