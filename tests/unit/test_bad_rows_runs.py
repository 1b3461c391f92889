"""Runs of bad rows with ``bad_rows="skip"``: a field that no row has ends the run at its
hundredth skip, not by reading every row; bad rows before the first document, among rows cut
by the length rules, and behind a filter are skipped as such."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_bad_rows import TEXTS, skipped
from zephon_torch import Pipeline
from zephon_torch.errors import DataError
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource


def in_order(folder: Path, exhaustion: str = "stop") -> StaticMixtureWorkSource:
    """One dataset read in stored order (no shuffle), so a lane meets its rows as written."""
    return StaticMixtureWorkSource(
        [Dataset.from_path("d", folder)],
        seed=1,
        shuffle=False,
        exhaustion=exhaustion,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("exhaustion", ["stop", "repeat"])
@pytest.mark.parametrize("stage", ["tokenize", "pretokenized"])
def test_a_field_in_no_row_ends_the_run_at_its_hundredth_skip(
    tmp_path: Path, tokenizer: Any, stage: str, exhaustion: str
) -> None:
    # a misspelt field: every row is bad; under "stop" the run gave 0 batches and warnings,
    # under "repeat" an error only once a whole pass proved the dataset barren
    folder = tmp_path / "corpus"
    folder.mkdir()
    for shard in range(3):  # 3 x 80 rows: a whole pass of one lane is 240 bad rows
        rows = [json.dumps({"text": t, "ids": [1, 2, 3]}) for t in TEXTS[:80]]
        (folder / f"part-{shard}.jsonl").write_text("\n".join(rows) + "\n")
    pipeline = Pipeline(in_order(folder, exhaustion)).options(bad_rows="skip")
    if stage == "tokenize":
        pipeline = pipeline.tokenize(tokenizer=tokenizer, field="txt")
    else:
        pipeline = pipeline.pretokenized("input_ids")
    pipeline = pipeline.pack_flat(32, "wrap").batch(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(DataError) as caught:
            list(pipeline)
    said = str(caught.value)
    assert caught.value.dataset == "d" and caught.value.row is None
    assert "the first 100 rows of it a lane read were all malformed" in said
    field = "txt" if stage == "tokenize" else "input_ids"
    # the first skipped row's own error, with the fields the row has
    assert f"part-0.jsonl', row 0: field '{field}' is missing" in said
    assert "['ids', 'text']" in said and "misspelt field name" in said


def test_ninety_nine_bad_rows_before_the_first_document_are_skipped(
    tmp_path: Path, tokenizer: Any
) -> None:
    bad = 99
    lines = ['{"body": "x"}'] * bad + [json.dumps({"text": t}) for t in TEXTS[: 90 - bad + 30]]
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "part-0.jsonl").write_text("\n".join(lines) + "\n")
    pipeline = (
        Pipeline(in_order(folder))
        .options(bad_rows="skip")
        .tokenize(tokenizer=tokenizer)
        .pack_flat(64, "wrap")
        .batch(2)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert list(pipeline)
    assert skipped(pipeline)["malformed"] == bad
    # one more bad row first, and the run ends
    (folder / "part-0.jsonl").write_text("\n".join(['{"body": "x"}', *lines]) + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(DataError, match="the first 100 rows of it a lane read were all"):
            list(
                Pipeline(in_order(folder))
                .options(bad_rows="skip")
                .tokenize(tokenizer=tokenizer)
                .pack_flat(64, "wrap")
                .batch(2)
            )


def test_bad_rows_among_rows_that_tokenize_but_are_cut_are_skipped(
    tmp_path: Path, tokenizer: Any
) -> None:
    """Rows that tokenize and are cut (too short) end the count: only a dataset whose first
    rows are all malformed is refused (a review found 125 bad rows among 250 short ones
    refused, the run going on before the rule)."""
    lines = ['{"body": "x"}' if i % 2 else json.dumps({"text": "short"}) for i in range(250)]
    lines += [json.dumps({"text": t}) for t in TEXTS[:30]]
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "part-0.jsonl").write_text("\n".join(lines) + "\n")
    pipeline = Pipeline(in_order(folder)).options(bad_rows="skip").tokenize(tokenizer=tokenizer)
    pipeline = pipeline.pack_flat(64, "wrap", min_document_length=8).batch(2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert list(pipeline)
    assert skipped(pipeline)["malformed"] == 125


@pytest.mark.parametrize("exhaustion", ["stop", "repeat"])
def test_a_misspelt_field_behind_a_filter_is_refused_in_its_first_rows(
    tmp_path: Path, tokenizer: Any, exhaustion: str
) -> None:
    """A row a plain filter drops proves nothing of the field tokenize reads: with a filter
    dropping every other row, the count went no further than the first drop, and a misspelt
    field gave 0 batches (or an error after a whole pass), as before the rule (a review)."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    rows = [json.dumps({"text": t, "lang": "en" if i % 2 else "fr"}) for i, t in enumerate(TEXTS)]
    for shard in range(4):
        (folder / f"part-{shard}.jsonl").write_text("\n".join(rows) + "\n")
    pipeline = (
        Pipeline(in_order(folder, exhaustion))
        .options(bad_rows="skip")
        .filter(english)
        .tokenize(tokenizer=tokenizer, field="txt")
        .pack_flat(64, "wrap")
        .batch(2)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(DataError, match="the first 100 rows of it a lane read were all"):
            list(pipeline)


def english(row: dict[str, Any]) -> bool:
    return bool(row["lang"] == "en")
