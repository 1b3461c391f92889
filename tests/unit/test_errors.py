"""Bad input gets a specific error naming what and where, and nothing hangs."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers import small_pipeline
from zephon_torch import ConfigError, DataError, Pipeline
from zephon_torch.io import Dataset
from zephon_torch.torch import DataLoader
from zephon_torch.work import StaticMixtureWorkSource, TokenEstimation


def pipeline_over(dataset: Dataset, tokenizer: Any, field: str = "text") -> Pipeline:
    source = StaticMixtureWorkSource([dataset], seed=0)
    return Pipeline(source).tokenize(tokenizer=tokenizer, field=field).pack_flat(32).batch(2)


def test_a_malformed_json_line_names_dataset_shard_and_row(tmp_path: Path, tokenizer: Any) -> None:
    shard = tmp_path / "part-0.jsonl"
    lines = [json.dumps({"text": f"document {i}"}) for i in range(10)]
    lines[6] = '{"text": "broken'
    shard.write_text("\n".join(lines) + "\n")
    pipeline = pipeline_over(Dataset.from_path("web", shard), tokenizer)
    with pytest.raises(DataError) as info:
        list(pipeline)
    assert info.value.dataset == "web" and info.value.row == 6
    assert "part-0.jsonl" in str(info.value) and "row 6" in str(info.value)


def test_a_misspelt_field_names_the_closest_field_of_the_row(
    tmp_path: Path, tokenizer: Any
) -> None:
    shard = tmp_path / "a.jsonl"
    shard.write_text("".join(json.dumps({"id": i, "text": "x"}) + "\n" for i in range(5)))
    dataset = Dataset.from_path("web", shard)
    with pytest.raises(DataError, match=r"fields \['id', 'text'\] \(did you mean 'text'\?\)"):
        list(pipeline_over(dataset, tokenizer, field="txt"))
    with pytest.raises(DataError) as info:  # no field's name is close: none is guessed
        list(pipeline_over(dataset, tokenizer, field="content"))
    assert "did you mean" not in str(info.value)


def test_a_missing_field_names_the_field_and_the_row(tmp_path: Path, tokenizer: Any) -> None:
    shard = tmp_path / "a.jsonl"
    shard.write_text(
        "".join(json.dumps({"text": "x"} if i != 3 else {"body": "y"}) + "\n" for i in range(5))
    )
    with pytest.raises(
        DataError,
        match=(
            r"dataset 'web', shard '.*a\.jsonl', row 3: "
            r"field 'text' is missing; the row has fields \['body'\]"
        ),
    ):
        list(pipeline_over(Dataset.from_path("web", shard), tokenizer))


def test_a_non_string_field_is_refused(tokenizer: Any) -> None:
    with pytest.raises(DataError, match="field 'text' must be a string, got int"):
        list(pipeline_over(Dataset.from_dict("nums", {"text": [1, 2]}), tokenizer))


def test_a_binary_parquet_column_of_text_reads_as_its_utf8_and_bad_bytes_name_the_row(
    tmp_path: Path, tokenizer: Any
) -> None:
    """Spark and other writers may store text as Parquet `binary` (no UTF-8 annotation): it
    was refused as "must be a string, got bytes" (fresh-user trial)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [f"document {i} of the binary column" for i in range(9)]
    for kind, values in (("string", texts), ("binary", [t.encode() for t in texts])):
        pq.write_table(
            pa.table({"text": pa.array(values, type=getattr(pa, kind)())}),
            tmp_path / f"{kind}.parquet",
        )
    batches = {}
    for kind in ("string", "binary"):
        dataset = Dataset.from_path("d", tmp_path / f"{kind}.parquet")  # one name: one order
        batches[kind] = [b.input_ids.tolist() for b in pipeline_over(dataset, tokenizer)]
    assert batches["binary"] == batches["string"] and batches["string"]
    bad = [t.encode() for t in texts]
    bad[4] = b"caf\xe9"  # Latin-1, not UTF-8
    pq.write_table(pa.table({"text": pa.array(bad, type=pa.binary())}), tmp_path / "bad.parquet")
    with pytest.raises(DataError, match=r"row 4: field 'text' holds bytes that are not UTF-8"):
        list(pipeline_over(Dataset.from_path("bad", tmp_path / "bad.parquet"), tokenizer))


def test_a_lone_surrogate_in_a_json_line_names_the_row(tmp_path: Path, tokenizer: Any) -> None:
    shard = tmp_path / "a.jsonl"
    lines = [json.dumps({"text": f"document {i}"}) for i in range(5)]
    lines[3] = '{"text": "broken \\ud800 text"}'  # valid JSON, not valid Unicode
    shard.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"row 3: field 'text' is not valid Unicode text"):
        list(pipeline_over(Dataset.from_path("web", shard), tokenizer))


def test_a_lone_surrogate_among_the_calibration_documents_names_the_row(
    tmp_path: Path, tokenizer: Any
) -> None:
    """Token estimation reads the first documents (and counts their bytes) before any
    batch: the bad text must still be a DataError naming the row."""
    shard = tmp_path / "a.jsonl"
    lines = [json.dumps({"text": f"document {i}"}) for i in range(5)]
    lines[3] = '{"text": "broken \\ud800 text"}'
    shard.write_text("\n".join(lines) + "\n")
    source = StaticMixtureWorkSource(
        [Dataset.from_path("web", shard)], seed=0, token_estimation=TokenEstimation()
    )
    pipeline = Pipeline(source).tokenize(tokenizer=tokenizer).pack_flat(32).batch(2)
    with pytest.raises(DataError, match=r"row 3: field 'text' is not valid Unicode text"):
        list(pipeline)


def test_an_empty_shard_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text(json.dumps({"text": "x"}) + "\n")
    (tmp_path / "b.jsonl").write_text("")
    with pytest.raises(DataError, match=r"dataset 'web', shard '.*b\.jsonl'.*no rows"):
        Dataset.from_path("web", tmp_path)


def test_an_unsupported_world_size_lists_the_supported_ones(tokenizer: Any) -> None:
    with pytest.raises(
        ConfigError,
        match=(
            r"`world_size` 3 does not divide `canonical_replicas` 8; "
            r"supported world sizes: \[1, 2, 4, 8\]"
        ),
    ):
        small_pipeline(tokenizer).options(canonical_replicas=8, world_size=3)
    # the default of 1 under a launcher of 2 ranks: where L is set, and that it defaults to 1
    with pytest.raises(ConfigError, match=r"options\(canonical_replicas=\.\.\.\)`, default 1"):
        small_pipeline(tokenizer).options(world_size=2, rank=0)


def test_a_rank_outside_the_world_is_refused(tokenizer: Any) -> None:
    with pytest.raises(ConfigError, match=r"`rank` must be in \[0, 2\), got 2"):
        small_pipeline(tokenizer).options(canonical_replicas=4, world_size=2, rank=2)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda p: p.batch(0), "`batch` needs packed rows"),
        (lambda p: p.tokenize("x", tokenizer=object()), "exactly one of"),
        (lambda p: p.pack_flat(64), "call `tokenize` \\(or `pretokenized`\\) first"),
    ],
)
def test_a_pipeline_built_out_of_order_says_what_is_missing(
    tokenizer: Any, build: Any, message: str
) -> None:
    source = StaticMixtureWorkSource([Dataset.from_dict("d", {"text": ["a"]})])
    with pytest.raises(ConfigError, match=message):
        build(Pipeline(source))


def test_a_pipeline_asked_before_its_packing_step_is_a_config_error(tokenizer: Any) -> None:
    """`pad_token_id` failed an assert (a bare AssertionError) before `pack_flat`."""
    source = StaticMixtureWorkSource([Dataset.from_dict("d", {"text": ["a"]})])
    partial = Pipeline(source).tokenize(tokenizer=tokenizer)
    with pytest.raises(ConfigError, match="`pad_token_id` is known once `pack_flat` or `pack_s"):
        _ = partial.pad_token_id
    untokenized = Pipeline(source)
    with pytest.raises(ConfigError, match="`pack_sequences` needs token ids: call `tokenize`"):
        untokenized.pack_sequences(8)
    for ask in (partial.state_dict, partial.fingerprint, partial.explain, lambda: iter(partial)):
        with pytest.raises(
            ConfigError,
            match=r"needs `tokenize` \(or `pretokenized`\), `pack_flat` \(or "
            r"`pack_sequences`\) and `batch`",
        ):
            ask()
    assert partial.pack_flat(8).pad_token_id == 0  # no EOS in this tokenizer: 0


def test_invalid_operator_arguments_name_the_argument(tokenizer: Any) -> None:
    source = StaticMixtureWorkSource([Dataset.from_dict("d", {"text": ["a"]})])
    p = Pipeline(source).tokenize(tokenizer=tokenizer)
    with pytest.raises(ConfigError, match="`max_length` must be a positive int, got 0"):
        p.pack_flat(0)
    # rows of one token: every label -100, a run that learns nothing (fresh-user trial)
    for pack in (p.pack_flat, p.pack_sequences):
        with pytest.raises(ConfigError, match=r"`max_length` must be at least 2: .* label"):
            pack(1)
    with pytest.raises(ConfigError, match="`algorithm` must be one of"):
        p.pack_flat(8, "zigzag")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="`microbatch_size` must be a positive int, got 0"):
        p.pack_flat(8).batch(0)
    with pytest.raises(ConfigError, match="`parallelism` must be a positive int, got 0"):
        Pipeline(source).tokenize(tokenizer=tokenizer, parallelism=0)
    with pytest.raises(ConfigError, match="`special_tokens` must be one of"):
        Pipeline(source).tokenize(tokenizer=tokenizer, special_tokens="eol")  # type: ignore[arg-type]
    for bad, said in ((-3, "a positive int, got -3"), (2.0, "an integer, got 2.0")):
        with pytest.raises(ConfigError, match=f"`max_length` must be {said}"):
            p.pack_flat(bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=f"`window` must be {said}"):
            p.pack_flat(8).shuffle(bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=f"`microbatch_size` must be {said}"):
            p.pack_flat(8).batch(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="`max_length` must be an integer, got True"):
        p.pack_flat(True)
    with pytest.raises(ConfigError, match=r"`max_length` must be a positive int, got 0$"):
        p.pack_flat(np.int64(0))  # the number, not its numpy repr
    with pytest.raises(ConfigError, match=r"`shard_size` must be a positive int or None, got 0"):
        Dataset.from_dict("d", {"text": ["a"]}, shard_size=0)
    # numpy integers are settings too, kept as plain ints (a state must be plain JSON)
    built = p.pack_flat(np.int64(8)).shuffle(np.int32(4)).batch(np.int16(2))
    assert [
        type(v) for v in (built._pack.max_length, built._shuffle_window, built._microbatch_size)
    ] == [
        int,
        int,
        int,
    ]
    with pytest.raises(ConfigError, match="needs a BOS token"):
        Pipeline(source).tokenize(tokenizer=tokenizer, special_tokens="bos")
    for bad in (["text"], "", None):  # was a TypeError or a DataError blaming the rows
        with pytest.raises(ConfigError, match="`field` must be a non-empty row field name"):
            Pipeline(source).pretokenized(bad)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="`field` must be a non-empty row field name"):
            Pipeline(source).tokenize(tokenizer=tokenizer, field=bad)  # type: ignore[arg-type]


@pytest.mark.filterwarnings(r"ignore:the tokenizer has no <\|im_start\|> token")
def test_a_second_token_stage_is_refused_with_what_to_do_instead(tokenizer: Any) -> None:
    """The message of a `map` after `tokenize` said `tokenize` must come before `tokenize`."""
    source = StaticMixtureWorkSource([Dataset.from_dict("d", {"text": ["a"]})])
    tokenized = Pipeline(source).tokenize(tokenizer=tokenizer)
    one = "a pipeline has one token stage .* and this one has `{}` already, so `{}` cannot"
    with pytest.raises(ConfigError, match=one.format("tokenize", "pretokenized")):
        tokenized.pretokenized("ids")
    with pytest.raises(ConfigError, match=one.format("pretokenized", "tokenize") + ".* a `map`"):
        Pipeline(source).pretokenized("ids").tokenize(tokenizer=tokenizer)
    with pytest.raises(ConfigError, match=one.format("tokenize_chat", "pretokenized")):
        Pipeline(source).tokenize_chat(tokenizer=tokenizer).pretokenized("ids")
    with pytest.raises(ConfigError, match="`map` must come before `tokenize`/`pretokenized`"):
        tokenized.map(dict)


def test_a_second_packing_is_refused_not_put_in_the_first_s_place(tokenizer: Any) -> None:
    """`.pack_flat(8).pack_flat(16)` packed by 16 without a word, and `pack_flat` after
    `pack_sequences` dropped its payloads and kept documents whole no longer."""
    source = StaticMixtureWorkSource([Dataset.from_dict("d", {"text": ["a"], "meta": [1]})])
    tokenized = Pipeline(source).tokenize(tokenizer=tokenizer)
    once = "a pipeline packs once and this one has `{}` already, so `{}` cannot follow"
    with pytest.raises(ConfigError, match=once.format("pack_flat", "pack_flat")):
        tokenized.pack_flat(8).pack_flat(16)
    with pytest.raises(ConfigError, match=once.format("pack_flat", "pack_sequences")):
        tokenized.pack_flat(8).batch(1).pack_sequences(16, payload_fields=["meta"])
    sequences = tokenized.pack_sequences(8, payload_fields=["meta"])
    with pytest.raises(ConfigError, match=once.format("pack_sequences", "pack_flat")):
        sequences.pack_flat(16)
    assert sequences.shuffle(2).batch(1).explain()  # what may follow packing still does


def test_to_training_flags_must_be_bools(tokenizer: Any) -> None:
    """`to_training(mask_document_boundaries="false")` masked the boundaries: any string was
    taken as true, where `to_torch` refuses it."""
    source = StaticMixtureWorkSource([Dataset.from_dict("d", {"text": ["a b c"]})])
    batch = next(iter(Pipeline(source).tokenize(tokenizer=tokenizer).pack_flat(8).batch(1)))
    with pytest.raises(ConfigError, match="`mask_document_boundaries` must be True or False"):
        batch.to_training(mask_document_boundaries="false")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="`attention_mask` must be True or False"):
        batch.to_training(attention_mask="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"min_document_length": "3"}, "`min_document_length` must be an integer, got '3'"),
        ({"min_document_length": None}, "`min_document_length` must be an integer, got None"),
        ({"min_document_length": 1.5}, "`min_document_length` must be an integer, got 1.5"),
        ({"max_length": True}, "`max_length` must be an integer, got True"),
        ({"num_bins": "4"}, "`num_bins` must be an integer, got '4'"),
        ({"num_bins": 2.5}, "`num_bins` must be an integer, got 2.5"),
        ({"max_sequences_per_bin": 2.0}, "`max_sequences_per_bin` must be an integer, got 2.0"),
    ],
)
def test_pack_flat_numbers_must_be_whole(
    tokenizer: Any, arguments: dict[str, Any], message: str
) -> None:
    """Each was a bare TypeError at the first batch, or taken as it was into the fingerprint."""
    source = StaticMixtureWorkSource([Dataset.from_dict("d", {"text": ["a"]})])
    p = Pipeline(source).tokenize(tokenizer=tokenizer)
    given = {"max_length": 8, "algorithm": "best_fit", **arguments}
    with pytest.raises(ConfigError, match=re.escape(message)):
        p.pack_flat(**given)
    with pytest.raises(ConfigError, match=re.escape("`microbatch_size` must be an integer")):
        p.pack_flat(8).batch(2.0)  # type: ignore[arg-type]
    numpy_ints = p.pack_flat(np.int64(8), "best_fit", num_bins=np.int32(2)).batch(np.int64(1))
    assert next(iter(numpy_ints)).input_ids.shape == (1, 8)
    assert numpy_ints.fingerprint()


def test_duplicate_dataset_names_are_refused() -> None:
    d = Dataset.from_dict("d", {"text": ["a"]})
    with pytest.raises(ConfigError, match=r"repeated: \['d'\]"):
        StaticMixtureWorkSource([d, d])


def _source(**kwargs: Any) -> StaticMixtureWorkSource:
    datasets = [Dataset.from_dict(n, {"text": [f"{n} {i}" for i in range(6)]}) for n in "ab"]
    return StaticMixtureWorkSource(datasets, **kwargs)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda tok: _source(shuffle="no"), "`shuffle` must be True or False, got 'no'"),
        (lambda tok: _source(mixture={"a": "0.7", "b": 0.3}), "weight of 'a' must be a positive"),
        (lambda tok: _source(mixture={"a": True, "b": 3}), "weight of 'a' must be a positive"),
        (lambda tok: _source(token_estimation=True), "`token_estimation` must be a TokenEst"),
        (lambda tok: StaticMixtureWorkSource(["a"]), "`datasets` must hold Datasets, got 'a'"),
        (lambda tok: Pipeline(_source()).options(prefetch=True), "`prefetch` must be .* got True"),
        (lambda tok: Pipeline(_source()).options(stats="no"), "`stats` must be True or False"),
        (
            lambda tok: Pipeline(_source()).options(stats_every=-3, on_stats=print),
            "`stats_every` must be >= 0, got -3",
        ),
        (
            lambda tok: Pipeline(_source()).options(stats_every=2, on_stats=5),
            "`on_stats` must be a function",
        ),
        (lambda tok: Pipeline(_source()).options(on_stats=print), "go together"),
        (
            lambda tok: Pipeline(_source()).tokenize(tokenizer=tok).pack_flat(8).shuffle(True),
            "`window` must be an integer, got True",
        ),
        (
            lambda tok: (
                Pipeline(_source())
                .tokenize(tokenizer=tok)
                .pack_sequences(8, payload_fields="image")
            ),
            "`payload_fields` must be a list of row field names, got 'image'",
        ),
        (
            lambda tok: (
                Pipeline(_source()).tokenize(tokenizer=tok).pack_sequences(8, min_document_length=9)
            ),
            "`min_document_length` 9 is above `max_length` 8, and documents are kept whole",
        ),
        (
            lambda tok: (
                Pipeline(_source()).tokenize(tokenizer=tok).pack_flat(8, "best_fit", num_bins=-3)
            ),
            "`num_bins` must be positive, got -3",
        ),
        (  # was ignored, while max_sequences_per_bin with 'wrap' was refused
            lambda tok: Pipeline(_source()).tokenize(tokenizer=tok).pack_flat(8, num_bins=3),
            "`num_bins` needs a bin packer, not 'wrap'",
        ),
        (
            lambda tok: Pipeline(_source()).tokenize(tokenizer=tok).stateful_filter("x"),  # type: ignore[arg-type]
            "`stateful_filter` takes a function of the lane",
        ),
        (lambda tok: DataLoader("x"), "`DataLoader` loads a Pipeline"),  # type: ignore[arg-type]
        (
            lambda tok: DataLoader(small_pipeline(tok), deliver_on_use="no"),  # type: ignore[arg-type]
            "`deliver_on_use` must be True or False",
        ),
        (
            lambda tok: DataLoader(small_pipeline(tok), num_workers=1, prefetch_factor=0),
            "`prefetch_factor` must be >= 1, got 0",
        ),
        (  # taken, then a bare TypeError at the first iteration
            lambda tok: DataLoader(small_pipeline(tok), num_workers=2.0),  # type: ignore[arg-type]
            "`num_workers` must be an integer, got 2.0",
        ),
        (  # torch's ValueError, naming no setting of ours
            lambda tok: DataLoader(small_pipeline(tok), num_workers=-1),
            "`num_workers` must be >= 0, got -1",
        ),
        (  # a bare TypeError comparing it with 1
            lambda tok: DataLoader(small_pipeline(tok), num_workers=2, prefetch_factor="2"),  # type: ignore[arg-type]
            "`prefetch_factor` must be an integer, got '2'",
        ),
        (  # torch's ValueError only where workers start; taken without them
            lambda tok: DataLoader(small_pipeline(tok), multiprocessing_context="spwan"),
            r"`multiprocessing_context` must be one of \[.*got 'spwan'",
        ),
        (
            lambda tok: small_pipeline(tok).explain(num_workers=-1),
            "`num_workers` must be >= 0, got -1",
        ),
        (
            lambda tok: Pipeline(_source()).options(io_options={"cache": False}),
            r"`io_options\['cache'\]` must be a mapping, got False",
        ),
        (
            lambda tok: Pipeline(_source()).options(io_options={"cache": {"dir": 5}}),
            "cache `dir` must be a folder path or None, got 5",
        ),
        (
            lambda tok: Pipeline(_source()).options(
                io_options={"retry": {"initial_delay": float("nan")}}
            ),
            "retry `initial_delay` must be a finite number of seconds >= 0, got nan",
        ),
        (  # an int past the largest float: an OverflowError from math.isfinite
            lambda tok: Pipeline(_source()).options(io_options={"retry": {"min_rate": 10**400}}),
            "retry `min_rate` must be a finite number of bytes/s >= 0, got 1000",
        ),
        (
            lambda tok: TokenEstimation(tokens_per_byte={"a": 10**400}),
            "`tokens_per_byte` of 'a' must be a positive number, got 1000",
        ),
        (
            lambda tok: Pipeline(_source()).options(io_options={"retry": {"rate_window": "5"}}),
            "retry `rate_window` must be a finite number of seconds >= 0, got '5'",
        ),
    ],
)
def test_a_setting_of_the_wrong_kind_is_refused_at_build_naming_it(
    tokenizer: Any, build: Any, message: str
) -> None:
    """Each was accepted and then ignored or taken oddly (shuffle(True) as a window of 1,
    "image" as five payload fields, a string weight, a negative period), or failed later with
    a bare TypeError or AttributeError (review of the configuration surface)."""
    with pytest.raises(ConfigError, match=message):
        build(tokenizer)


def test_numpy_integers_and_a_generator_of_datasets_are_taken(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Some integer settings refused numpy integers that others took; a generator of datasets
    was read once for the names and left the source with none: an empty run, no word."""
    n = np.int64(4)
    source = StaticMixtureWorkSource(
        (d for d in _source().datasets), seed=n, shuffle_window_shards=n
    )
    assert [d.name for d in source.datasets] == ["a", "b"]
    pipeline = (
        Pipeline(source)
        .options(prefetch=n, io_options={"cache": {"max_bytes": n << 30}})
        .tokenize(tokenizer=tokenizer, parallelism=n)
        .pack_flat(8)
        .shuffle(n)
        .batch(2)
    )
    assert len(list(pipeline)) > 0
    assert Dataset.from_dict("d", {"t": [1, 2]}, shard_size=np.int64(1)).num_rows == 2
    # a rank given alone is checked against the world the environment gives
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "1")
    assert small_pipeline(tokenizer).options(canonical_replicas=4, rank=1).lanes == [1]


def test_the_errors_module_exports_its_exceptions_and_no_helper() -> None:
    import inspect

    from zephon_torch import errors

    exceptions = sorted(
        name
        for name, value in vars(errors).items()
        if inspect.isclass(value)
        and issubclass(value, BaseException)
        and value.__module__ == errors.__name__
        and not name.startswith("_")
    )
    assert errors.__all__ == exceptions
