"""``options(bad_rows="skip")``: a row whose reading or processing raises a ``DataError`` naming
it gives no tokens and is counted as malformed, exactly as if it were an empty row, on every
runner, lane split and resume; errors that name no row still raise."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import prose_documents
from tests.helpers import assert_resumes_at_every_step, keys
from zephon_torch import Pipeline
from zephon_torch.errors import ConfigError, DataError
from zephon_torch.io import Dataset
from zephon_torch.io._rows import check_in_range
from zephon_torch.ops.document import skipping_bad
from zephon_torch.ops.stateful import StatefulFilter
from zephon_torch.torch import DataLoader
from zephon_torch.verify import standard_run
from zephon_torch.work import StaticMixtureWorkSource, TokenEstimation

TEXTS = prose_documents(90, seed=3, max_words=120)
# row -> its line: malformed JSON, no text field, a text that is no string, a row the map
# refuses, and (for pre-tokenized data) ids that are no list of ints
BAD_TEXT = {
    4: '{"text": "abc"',
    17: '{"body": "no text"}',
    33: '{"text": 5}',
    50: json.dumps({"text": "BOOM " + TEXTS[50]}),
    51: '{"text": "\\ud800 a lone surrogate"}',
}
BAD_IDS = {3: '{"ids": [1, 2', 40: '{"ids": "1 2 3"}', 41: '{"ids": [[1, 2]]}', 77: '{"x": 1}'}


def _write(folder: Path, lines: list[str]) -> Path:
    folder.mkdir(parents=True)
    for shard in range(3):
        part = lines[shard * 30 : shard * 30 + 30]
        (folder / f"part-{shard}.jsonl").write_text("\n".join(part) + "\n")
    return folder


def text_corpus(root: Path, *, clean: bool) -> Path:
    """90 rows of prose in 3 shards; the rows of BAD_TEXT bad, or (clean) empty texts."""
    lines = [
        ('{"text": ""}' if clean else BAD_TEXT[i]) if i in BAD_TEXT else json.dumps({"text": t})
        for i, t in enumerate(TEXTS)
    ]
    return _write(root / ("clean" if clean else "bad"), lines)


def ids_corpus(root: Path, *, clean: bool) -> Path:
    """90 rows of token ids (lists) in 3 shards; the rows of BAD_IDS bad, or (clean) empty."""
    lines = [
        ('{"ids": []}' if clean else BAD_IDS[i])
        if i in BAD_IDS
        else json.dumps({"ids": list(range(i % 7, i % 7 + 5 + i % 23))})
        for i in range(90)
    ]
    return _write(root / ("ids-clean" if clean else "ids-bad"), lines)


def one_of(error: DataError, bad: dict[int, str]) -> bool:
    """Whether ``error`` names one of the rows of ``bad`` (by index over the 3 shards)."""
    assert error.shard is not None
    return any(error.shard.endswith(f"part-{i // 30}.jsonl") and error.row == i % 30 for i in bad)


def boom(row: dict[str, Any]) -> dict[str, Any]:
    if row["text"].startswith("BOOM"):
        raise ValueError("boom")
    return row


def text_pipeline(
    folder: Path,
    tokenizer: Any,
    bad_rows: str,
    *,
    lanes: int = 2,
    runner: str = "threads",
    name: str = "d",
) -> Pipeline:
    source = StaticMixtureWorkSource(
        [Dataset.from_path(name, folder)],
        seed=1,
        token_estimation=TokenEstimation(calibration_documents=8),  # meets bad rows
        exhaustion="stop",
    )
    return (
        Pipeline(source)
        .options(canonical_replicas=lanes, bad_rows=bad_rows)  # type: ignore[arg-type]
        .map(boom)
        .tokenize(tokenizer=tokenizer, runner=runner)  # type: ignore[arg-type]
        .pack_flat(64, "wrap")
        .batch(2)
    )


def ids_pipeline(folder: Path, bad_rows: str, *, eos: int | None = None) -> Pipeline:
    source = StaticMixtureWorkSource([Dataset.from_path("d", folder)], seed=1, exhaustion="stop")
    return (
        Pipeline(source)
        .options(canonical_replicas=2, bad_rows=bad_rows)  # type: ignore[arg-type]
        .pretokenized("ids", eos_token_id=eos)
        .pack_flat(32, "wrap")
        .batch(2)
    )


def skipped(pipeline: Pipeline) -> dict[str, int]:
    return pipeline.stats()["skipped_documents"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("runner", ["threads", "inline", "processes"])
def test_skipped_rows_give_the_stream_of_empty_rows(
    tmp_path: Path, tokenizer: Any, runner: str
) -> None:
    bad = text_pipeline(text_corpus(tmp_path, clean=False), tokenizer, "skip", runner=runner)
    clean = text_pipeline(text_corpus(tmp_path, clean=True), tokenizer, "raise")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the skip warning: tested below
        got = keys(bad)
    assert got == keys(clean)
    assert skipped(bad)["malformed"] == len(BAD_TEXT)
    assert skipped(bad)["empty"] == skipped(clean)["empty"] - len(BAD_TEXT)
    assert skipped(clean)["malformed"] == 0


def test_raise_is_the_default_and_names_the_row(tmp_path: Path, tokenizer: Any) -> None:
    folder = text_corpus(tmp_path, clean=False)
    source = StaticMixtureWorkSource([Dataset.from_path("bad", folder)], seed=1)
    pipeline = Pipeline(source).tokenize(tokenizer=tokenizer).pack_flat(64, "wrap").batch(2)
    with pytest.raises(DataError) as raised:
        list(pipeline)
    assert raised.value.dataset == "bad" and one_of(raised.value, BAD_TEXT)
    # what to do, said once (a fresh-user trial: the errors named the place, not the option)
    hint = "(options(bad_rows='skip') skips such rows and counts them)"
    assert str(raised.value).endswith(hint) and str(raised.value).count(hint) == 1


def test_one_warning_per_dataset_and_iteration_names_the_first_bad_row(
    tmp_path: Path, tokenizer: Any
) -> None:
    folder = text_corpus(tmp_path, clean=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        list(text_pipeline(folder, tokenizer, "skip", name="warned"))  # two lanes
        list(text_pipeline(folder, tokenizer, "skip", name="warned"))  # another pipeline
    words = [str(w.message) for w in caught if "bad_rows='skip'" in str(w.message)]
    assert len(words) == 2, words
    assert "the first: dataset 'warned', shard" in words[0] and "row " in words[0]
    assert "(line " in words[0]  # a JSONL row's line in the file, as raised errors give it


def test_resumes_at_every_step_across_bad_rows(tmp_path: Path, tokenizer: Any) -> None:
    folder = text_corpus(tmp_path, clean=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert assert_resumes_at_every_step(lambda: text_pipeline(folder, tokenizer, "skip")) > 20


def test_same_batches_on_each_world_size(tmp_path: Path, tokenizer: Any) -> None:
    folder = text_corpus(tmp_path, clean=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole = keys(text_pipeline(folder, tokenizer, "skip"))
        ranks = [
            keys(text_pipeline(folder, tokenizer, "skip").options(world_size=2, rank=r))
            for r in (0, 1)
        ]
    # each rank of W=2 emits one of the lanes W=1 emits (a batch's key names its lane and turn),
    # up to the turn where the first rank's lane ran out (both stop there; W=1 goes on)
    assert {lane for lane, *_ in ranks[0]} == {0} and {lane for lane, *_ in ranks[1]} == {1}
    turns = min(len(ranks[0]), len(ranks[1]))
    assert sorted(ranks[0][:turns] + ranks[1][:turns]) == sorted(k for k in whole if k[1] < turns)


def test_a_run_stopped_by_a_bad_row_resumes_with_skip(tmp_path: Path, tokenizer: Any) -> None:
    """bad_rows is no recipe setting: the last state before the error loads with "skip" and
    goes on as a run that skipped from the start."""
    folder = text_corpus(tmp_path, clean=False)
    rows = [json.loads(line) for line in (folder / "part-0.jsonl").read_text().splitlines()[5:]]
    assert rows  # the run gets past the first bad row before its error (no calibration)

    def build(bad_rows: str) -> Pipeline:
        source = StaticMixtureWorkSource(
            [Dataset.from_path("bad", folder)], seed=1, exhaustion="stop"
        )
        return (
            Pipeline(source)
            .options(bad_rows=bad_rows)  # type: ignore[arg-type]
            .map(boom)
            .tokenize(tokenizer=tokenizer)
            .pack_flat(64, "wrap")
            .batch(2)
        )

    strict = build("raise")
    state, delivered = strict.state_dict(), 0
    with pytest.raises(DataError):
        for _ in strict:
            state, delivered = strict.state_dict(), delivered + 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = keys(build("skip"))
        resumed = build("skip")
        resumed.load_state_dict(state)
        assert keys(resumed) == reference[delivered:]
    assert skipped(resumed)["malformed"] == len(BAD_TEXT)


@pytest.mark.parametrize("eos", [None, 9])
def test_pretokenized_rows_skipped_as_empty_ones(tmp_path: Path, eos: int | None) -> None:
    bad = ids_pipeline(ids_corpus(tmp_path, clean=False), "skip", eos=eos)
    clean = ids_pipeline(ids_corpus(tmp_path, clean=True), "raise", eos=eos)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = keys(bad)
    assert got == keys(clean)
    assert skipped(bad)["malformed"] == len(BAD_IDS)
    with pytest.raises(DataError) as raised:
        list(ids_pipeline(ids_corpus(tmp_path / "again", clean=False), "raise", eos=eos))
    assert one_of(raised.value, BAD_IDS)


def test_pretokenized_resumes_at_every_step_across_bad_rows(tmp_path: Path) -> None:
    folder = ids_corpus(tmp_path, clean=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert assert_resumes_at_every_step(lambda: ids_pipeline(folder, "skip")) > 20


def test_an_error_naming_no_row_still_raises(tmp_path: Path, tokenizer: Any) -> None:
    """A shard that cannot be read is no bad row: skipping it would drop a whole shard."""
    folder = text_corpus(tmp_path, clean=True)
    (folder / "part-1.jsonl").unlink()
    (folder / "part-1.jsonl.gz").write_bytes(b"\x1f\x8b\x08\x00 not gzip at all")
    with pytest.raises(DataError) as raised:
        list(text_pipeline(folder, tokenizer, "skip"))
    assert raised.value.row is None and "part-1.jsonl.gz" in str(raised.value)


def test_a_shard_changed_after_opening_still_raises(tmp_path: Path, tokenizer: Any) -> None:
    """Rows a changed shard no longer holds are its fault, not theirs: skipping them would drop
    the rest of the shard."""
    folder = text_corpus(tmp_path, clean=True)
    pipeline = text_pipeline(folder, tokenizer, "skip", lanes=1)
    shard = folder / "part-2.jsonl"
    text = shard.read_text()
    shard.write_text(text[: len(text) // 2])
    with pytest.raises(DataError, match="rewritten") as raised:
        list(pipeline)
    assert "part-2.jsonl" in str(raised.value)
    assert "bad_rows" not in str(raised.value)  # no row's fault: no advice to skip rows


def test_a_row_past_a_changed_shard_is_the_shards_fault() -> None:
    with pytest.raises(DataError) as raised:
        check_in_range(np.array([1, 5]), 3, dataset="d", shard="s", note="")
    assert raised.value.row == 5 and raised.value.shard_wide
    with pytest.raises(DataError, match="out of range"):
        skipping_bad(
            lambda rows: check_in_range(np.array(rows), 3, dataset="d", shard="s", note=""),
            [1, 5],
            lambda row, error: None,
        )


def keeps_nothing_said(row: dict[str, Any]) -> bool:
    """A filter with a missed `return` on its long rows: None for them."""
    if len(row["text"]) < 300:
        return True
    return None  # type: ignore[return-value]


def test_a_filter_that_decides_nothing_still_raises(tmp_path: Path, tokenizer: Any) -> None:
    """A filter returning None is wrong on every row it meets, not the row's fault: skipping
    would have dropped (and counted as malformed) every long row, with one warning."""
    source = StaticMixtureWorkSource(
        [Dataset.from_path("d", text_corpus(tmp_path, clean=True))], seed=1, exhaustion="stop"
    )
    pipeline = (
        Pipeline(source)
        .options(bad_rows="skip")
        .filter(keeps_nothing_said)
        .tokenize(tokenizer=tokenizer)
        .pack_flat(64, "wrap")
        .batch(2)
    )
    with pytest.raises(DataError, match=r"row \d+: filter .*keeps_nothing_said.* returned None"):
        list(pipeline)


def test_a_measure_refusing_a_row_skips_it_in_calibration(tmp_path: Path, tokenizer: Any) -> None:
    """A custom `measure` that refuses a row the run will skip (text that is not valid Unicode)
    does not end the run at calibration under skip; the figures come from the other rows. It
    still raises under the default."""
    lines = [BAD_TEXT[51] if i == 51 else json.dumps({"text": t}) for i, t in enumerate(TEXTS)]
    folder = _write(tmp_path / "surrogate", lines)
    seen: list[str] = []

    def measure(text: str) -> int:
        seen.append(text)
        return len(text.encode("utf-8")) // 4

    def run(bad_rows: str) -> Pipeline:
        source = StaticMixtureWorkSource(
            [Dataset.from_path("d", folder)],
            seed=1,
            token_estimation=TokenEstimation(calibration_documents=60, measure=measure),
            exhaustion="stop",
        )
        pipeline = (
            Pipeline(source)
            .options(canonical_replicas=2, bad_rows=bad_rows)  # type: ignore[arg-type]
            .tokenize(tokenizer=tokenizer)
            .pack_flat(64, "wrap")
            .batch(2)
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            list(pipeline)
        return pipeline

    with pytest.raises(DataError, match=r"row 21: TokenEstimation `measure` raised Unicode"):
        run("raise")
    seen.clear()
    pipeline = run("skip")
    assert skipped(pipeline)["malformed"] == 1  # the run skips it too
    figures = pipeline.state_dict()["estimation"]["d"]
    # the 60 rows calibration reads (in the pass's order), the refused one among them
    assert len(seen) == 60 and sum(t.startswith("\ud800") for t in seen) == 1
    texts = [t for t in seen if not t.startswith("\ud800")]
    measured = sum(len(t.encode("utf-8")) // 4 for t in texts)
    assert figures["tokens_per_document"] == pytest.approx(measured / len(texts))
    nbytes = sum(len(t.encode("utf-8")) for t in texts)
    assert figures["tokens_per_byte"] == pytest.approx(measured / nbytes)

    def measure(text: str) -> int:  # noqa: F811 (a measure wrong on every row)
        return int(text)

    with pytest.raises(DataError, match=r"`measure` raised ValueError"):
        run("skip")  # its own fault, on a row the run reads: not hidden (a review)


def test_bad_rows_setting_is_checked() -> None:
    source = StaticMixtureWorkSource(
        [Dataset.from_dict("d", {"text": ["a"]})], seed=1, exhaustion="stop"
    )
    with pytest.raises(ConfigError, match="bad_rows"):
        Pipeline(source).options(bad_rows="ignore")  # type: ignore[arg-type]


class Seen(StatefulFilter):
    """Keeps every document, counting them; refuses a document of no tokens (which a skipped
    row would be, were it handed over)."""

    def __init__(self) -> None:
        self.seen = 0

    def keep(self, tokens: Any, source: str) -> bool:
        assert len(tokens), "a skipped row reached the filter"
        self.seen += 1
        return True

    def state_dict(self) -> dict[str, Any]:
        return {"seen": self.seen}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seen = state["seen"]


def test_skipped_rows_pass_stateful_filters_by(tmp_path: Path, tokenizer: Any) -> None:
    folder = text_corpus(tmp_path, clean=False)
    made: list[Seen] = []

    def factory(lane: int) -> Seen:
        made.append(Seen())
        return made[-1]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = keys(text_pipeline(folder, tokenizer, "skip"))
        pipeline = text_pipeline(folder, tokenizer, "skip").stateful_filter(factory, name="seen")
        assert keys(pipeline) == plain
    assert skipped(pipeline)["malformed"] == len(BAD_TEXT)
    assert sum(f.seen for f in made[-2:]) == len(TEXTS) - len(BAD_TEXT)


def test_explain_shows_the_policy(tmp_path: Path, tokenizer: Any) -> None:
    folder = text_corpus(tmp_path, clean=True)
    assert "bad rows: raise" in text_pipeline(folder, tokenizer, "raise").explain()
    assert "bad rows: skipped and counted" in text_pipeline(folder, tokenizer, "skip").explain()


def test_dataloader_workers_skip_the_same_rows(tmp_path: Path, tokenizer: Any) -> None:
    folder = text_corpus(tmp_path, clean=False)
    clean = text_corpus(tmp_path, clean=True)

    def ids(loader: Any) -> list[bytes]:
        return [item["input_ids"].numpy().tobytes() for item in loader]

    reference = ids(DataLoader(text_pipeline(clean, tokenizer, "raise", lanes=4)))
    loader = DataLoader(
        text_pipeline(folder, tokenizer, "skip", lanes=4),
        num_workers=2,
        multiprocessing_context="fork",
    )
    assert ids(loader) == reference
    assert loader.stats()["skipped_documents"]["malformed"] == len(BAD_TEXT)


def test_verify_s_standard_baseline_skips_the_same_rows(tmp_path: Path, tokenizer: Any) -> None:
    """It ran the operators itself, so a recipe that skips bad rows failed there alone."""
    folder, clean = text_corpus(tmp_path, clean=False), text_corpus(tmp_path, clean=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = standard_run(lambda: text_pipeline(folder, tokenizer, "skip"), 1, 20)
    assert got == standard_run(lambda: text_pipeline(clean, tokenizer, "raise"), 1, 20)
    assert len(got) == 20


def test_a_source_of_bad_rows_alone_is_reported_with_them(tmp_path: Path, tokenizer: Any) -> None:
    folder = tmp_path / "all-bad"
    folder.mkdir()
    (folder / "part.jsonl").write_text('{"text": 1}\n' * 12)

    def build(exhaustion: str) -> Pipeline:
        source = StaticMixtureWorkSource(
            [Dataset.from_path("d", folder)],
            seed=1,
            exhaustion=exhaustion,  # type: ignore[arg-type]
        )
        return (
            Pipeline(source)
            .options(bad_rows="skip")
            .tokenize(tokenizer=tokenizer)
            .pack_flat(64, "wrap")
            .batch(2)
        )

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert list(build("stop")) == []
    said = " ".join(str(w.message) for w in caught)
    assert "gave a lane no token" in said and "skipped as malformed" in said
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(DataError, match="empty or skipped as malformed"):
            list(build("repeat"))


def test_a_null_id_skips_its_parquet_row_alone(tmp_path: Path) -> None:
    """The row group decoded with it reads: only the row that holds the null is skipped."""
    kind = pa.list_(pa.int32())
    ids = [list(range(i % 5, i % 5 + 3 + i % 11)) for i in range(60)]
    bad, clean = list(ids), list(ids)
    bad[13], clean[13] = [4, None, 6], []
    for name, column in (("pq-bad", bad), ("pq-clean", clean)):
        (tmp_path / name).mkdir()
        table = pa.table({"ids": pa.array(column, kind)})
        pq.write_table(table, tmp_path / name / "part.parquet", row_group_size=10)

    def build(name: str, bad_rows: str) -> Pipeline:
        dataset = Dataset.from_path("d", tmp_path / name, token_columns=["ids"])
        source = StaticMixtureWorkSource([dataset], seed=1, exhaustion="stop")
        return (
            Pipeline(source)
            .options(canonical_replicas=2, bad_rows=bad_rows)  # type: ignore[arg-type]
            .pretokenized("ids")
            .pack_flat(16, "wrap")
            .batch(2)
        )

    skipping = build("pq-bad", "skip")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert keys(skipping) == keys(build("pq-clean", "raise"))
    assert skipped(skipping)["malformed"] == 1


def suffixed(row: dict[str, Any]) -> dict[str, Any]:
    """Not idempotent: a second run on its own output would add the suffix twice."""
    boom(row)
    return {"text": row["text"] + " zzqx" if row["text"] else ""}


def suffixed_in_place(row: dict[str, Any]) -> dict[str, Any]:
    boom(row)
    row["text"] += " zzqx" if row["text"] else ""
    return row


@pytest.mark.parametrize("fn", [suffixed, suffixed_in_place])
def test_a_retried_operator_sees_each_row_as_read(tmp_path: Path, tokenizer: Any, fn: Any) -> None:
    """A stage is tried again once its bad row is set apart: the rows it had mapped before
    the error were mapped twice (the documents it had changed were handed back to it)."""

    def build(folder: Path, bad_rows: str) -> Pipeline:
        source = StaticMixtureWorkSource([Dataset.from_path("d", folder)], seed=1)
        return (
            Pipeline(source)
            .options(bad_rows=bad_rows)  # type: ignore[arg-type]
            .map(fn)
            .tokenize(tokenizer=tokenizer, runner="inline")
            .pack_flat(64, "wrap")
            .batch(2)
        )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = keys(build(text_corpus(tmp_path, clean=False), "skip"))
    assert got == keys(build(text_corpus(tmp_path, clean=True), "raise"))


def test_ids_read_after_a_map_are_skipped_row_by_row(tmp_path: Path) -> None:
    """The per-document path of pre-tokenized data (a map before it): a try that failed had
    cleared the rows before the bad one, whose ids then read as missing."""

    def build(folder: Path, bad_rows: str) -> Pipeline:
        source = StaticMixtureWorkSource([Dataset.from_path("d", folder)], seed=1)
        return (
            Pipeline(source)
            .options(canonical_replicas=2, bad_rows=bad_rows)  # type: ignore[arg-type]
            .map(dict, name="copy")
            .pretokenized("ids")
            .pack_flat(32, "wrap")
            .batch(2)
        )

    skipping = build(ids_corpus(tmp_path, clean=False), "skip")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = keys(skipping)
    assert got == keys(build(ids_corpus(tmp_path, clean=True), "raise"))
    assert skipped(skipping)["malformed"] == len(BAD_IDS)


def test_a_row_whose_line_cannot_be_told_is_warned_of_without_it(
    tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The line is looked up on the packer's thread for the warning alone: a file that cannot
    be looked at then (a remote copy gone from the cache, say) must not end the run."""
    folder = text_corpus(tmp_path, clean=False)

    def unreachable(reader: Any, path: str, row: int) -> str | None:
        raise OSError("the copy is gone")

    monkeypatch.setattr("zephon_torch.io.dataset.where_in_file", unreachable)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        list(text_pipeline(folder, tokenizer, "skip", name="no-line"))
    words = [str(w.message) for w in caught if "bad_rows='skip'" in str(w.message)]
    assert len(words) == 1 and "dataset 'no-line'" in words[0] and "(line " not in words[0]
