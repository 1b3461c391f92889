"""A JSONL row's error names its line in the file: rows count non-blank lines from 0, so in a
file with blank lines "row 30" alone sends the user to the wrong line."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from tests.helpers import memory_copy
from tests.unit.io.conftest import WriteJsonl, WriteParquet, encode_lines
from zephon_torch import Pipeline
from zephon_torch.errors import DataError
from zephon_torch.io import Dataset
from zephon_torch.torch import DataLoader
from zephon_torch.work import StaticMixtureWorkSource

BAD_ROW = 30


def lines_with_blanks(bad: str) -> list[str]:
    """50 rows, row ``BAD_ROW`` being ``bad``, with a blank line after every fifth row, and
    blank lines (one of spaces) before the first."""
    lines = ["", "   "]
    for i in range(50):
        lines.append(bad if i == BAD_ROW else json.dumps({"text": f"doc {i}"}))
        if i % 5 == 0:
            lines.append("")
    return lines


def first_error(dataset: Dataset, tokenizer: Tokenizer, **loader: Any) -> DataError:
    source = StaticMixtureWorkSource([dataset], seed=1, exhaustion="stop")
    pipeline = (
        Pipeline(source).options(canonical_replicas=1).tokenize(tokenizer).pack_flat(32).batch(2)
    )
    with pytest.raises(DataError) as caught:
        for _ in DataLoader(pipeline, **loader) if loader else pipeline:
            pass
    return caught.value


def named_line(error: DataError) -> int:
    found = re.findall(r"\(line (\d+) of the file(?: once decompressed)?\)", str(error))
    assert len(found) == 1, str(error)
    return int(found[0])


@pytest.mark.parametrize("compression", [None, "gzip", "zstd"])
def test_a_field_error_names_the_line_of_the_row(
    tmp_path: Path, tokenizer: Tokenizer, write_jsonl: WriteJsonl, compression: str | None
) -> None:
    lines = lines_with_blanks(json.dumps({"text": None}))
    path = write_jsonl(tmp_path / "a.jsonl", text="\n".join(lines) + "\n", compression=compression)
    error = first_error(Dataset.from_path("jl", path), tokenizer)
    assert error.row == BAD_ROW
    line = named_line(error)
    assert lines[line - 1] == json.dumps({"text": None})  # the line named holds the bad row
    assert line != BAD_ROW + 1  # which the row number alone would not have found
    assert ("once decompressed" in str(error)) == (compression is not None)
    assert "must be a string" in str(error)


def test_a_malformed_line_is_named_by_its_line_too(
    tmp_path: Path, tokenizer: Tokenizer, write_jsonl: WriteJsonl
) -> None:
    lines = lines_with_blanks('{"text": "cut short')
    path = write_jsonl(tmp_path / "a.jsonl", text="\n".join(lines) + "\n")
    error = first_error(Dataset.from_path("jl", path), tokenizer)
    assert error.row == BAD_ROW
    assert lines[named_line(error) - 1] == '{"text": "cut short'
    assert "malformed JSON" in str(error)


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_a_malformed_last_line_with_no_newline_asks_whether_the_file_was_cut_short(
    tmp_path: Path, tokenizer: Tokenizer, write_jsonl: WriteJsonl, compression: str | None
) -> None:
    """A copy stopped midway leaves a last line cut mid-record; its error read as any other
    malformed line's ("Unterminated string"), not as the cut file it points to."""
    whole = [json.dumps({"text": f"doc {i}"}) for i in range(20)]
    cut = "\n".join(whole)[:-9]  # the last line cut mid-string, no newline after it
    path = write_jsonl(tmp_path / "a.jsonl", text=cut, compression=compression)
    error = first_error(Dataset.from_path("jl", path), tokenizer)
    assert error.row == 19 and "malformed JSON" in str(error)
    assert "no newline ends it: was the file cut short" in str(error)
    # the same line mid-file, or last with its newline, is only malformed
    for text in (cut + "\n", "\n".join([*whole[:5], whole[19][:-9], *whole[5:]]) + "\n"):
        path = write_jsonl(tmp_path / "b.jsonl", text=text, compression=compression)
        error = first_error(Dataset.from_path("jl", path), tokenizer)
        assert "malformed JSON" in str(error) and "cut short" not in str(error)


def test_the_line_reaches_the_main_process_from_a_loader_worker(
    tmp_path: Path, tokenizer: Tokenizer, write_jsonl: WriteJsonl
) -> None:
    lines = lines_with_blanks(json.dumps({"text": 7}))
    path = write_jsonl(tmp_path / "a.jsonl", text="\n".join(lines) + "\n")
    error = first_error(Dataset.from_path("jl", path), tokenizer, num_workers=1)
    assert error.row == BAD_ROW and error.dataset == "jl"
    assert lines[named_line(error) - 1] == json.dumps({"text": 7})


def test_a_remote_shard_is_named_by_its_url_and_line(
    tmp_path: Path, tokenizer: Tokenizer, write_jsonl: WriteJsonl
) -> None:
    lines = lines_with_blanks(json.dumps({"body": "no text field"}))
    write_jsonl(tmp_path / "data" / "a.jsonl", text="\n".join(lines) + "\n")
    url = memory_copy(tmp_path / "data")
    dataset = Dataset.from_path("jl", url, io_options={"cache": {"dir": str(tmp_path / "c")}})
    error = first_error(dataset, tokenizer)
    assert error.shard is not None and error.shard.startswith("memory://")
    assert lines[named_line(error) - 1] == json.dumps({"body": "no text field"})


def test_other_formats_keep_their_row_alone(
    tmp_path: Path, tokenizer: Tokenizer, write_parquet: WriteParquet
) -> None:
    rows: list[dict[str, Any]] = [{"text": f"doc {i}"} for i in range(50)]
    rows[BAD_ROW] = {"text": None}
    path = write_parquet(tmp_path / "a.parquet", rows, row_group_size=7)
    error = first_error(Dataset.from_path("pq", path), tokenizer)
    assert error.row == BAD_ROW
    assert "of the file" not in str(error)


def test_line_of_past_the_end_or_of_a_missing_file_tells_nothing(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_bytes(encode_lines("\n\n" + json.dumps({"text": "x"}) + "\n", None))
    dataset = Dataset.from_path("jl", path)
    assert dataset.line_of(str(path), 0) == "line 3 of the file"
    assert dataset.line_of(str(path), 1) is None
    path.write_bytes(b"\n")  # cut short since it was indexed: no line is named
    assert dataset.line_of(str(path), 0) is None
    path.unlink()
    assert dataset.line_of(str(path), 0) is None


def test_the_line_is_read_from_the_copy_the_pipeline_reads(
    tmp_path: Path, tokenizer: Tokenizer, write_jsonl: WriteJsonl
) -> None:
    """Told by the datasets as opened, not as `options(io_options=)` has them read, a remote
    shard was downloaded again into the other cache just to name the line (review D2, 2)."""
    lines = lines_with_blanks(json.dumps({"text": None}))
    write_jsonl(tmp_path / "data" / "a.jsonl", text="\n".join(lines) + "\n")
    url = memory_copy(tmp_path / "data")
    opened, used = tmp_path / "opened-cache", tmp_path / "used-cache"
    dataset = Dataset.from_path("jl", url, io_options={"cache": {"dir": str(opened)}})
    shutil.rmtree(opened)  # the open counted the rows of a download there
    source = StaticMixtureWorkSource([dataset], seed=1, exhaustion="stop")
    pipeline = (
        Pipeline(source)
        .options(canonical_replicas=1, io_options={"cache": {"dir": str(used)}})
        .tokenize(tokenizer)
        .pack_flat(32)
        .batch(2)
    )
    with pytest.raises(DataError) as caught:
        for _ in pipeline:
            pass
    assert lines[named_line(caught.value) - 1] == json.dumps({"text": None})
    assert not opened.exists()


def test_a_users_error_naming_a_shard_of_no_dataset_stays_as_it_is(
    tmp_path: Path, tokenizer: Tokenizer, write_jsonl: WriteJsonl
) -> None:
    """A `map` may raise a DataError naming any shard: looking its line up in a remote
    dataset's listing raised a KeyError instead of the user's error (review D2, 4)."""
    write_jsonl(tmp_path / "data" / "a.jsonl", [{"text": f"doc {i}"} for i in range(20)])
    url = memory_copy(tmp_path / "data")
    dataset = Dataset.from_path("jl", url, io_options={"cache": {"dir": str(tmp_path / "c")}})

    def complain(row: dict[str, Any]) -> dict[str, Any]:
        raise DataError("not mine", dataset="jl", shard="memory://elsewhere/b.jsonl", row=3)

    source = StaticMixtureWorkSource([dataset], seed=1, exhaustion="stop")
    pipeline = Pipeline(source).map(complain).tokenize(tokenizer).pack_flat(32).batch(2)
    with pytest.raises(DataError, match="not mine") as caught:
        for _ in pipeline:
            pass
    assert caught.value.shard == "memory://elsewhere/b.jsonl" and "of the file" not in str(
        caught.value
    )


def test_a_row_read_to_calibrate_the_token_estimation_is_named_by_its_line(
    tmp_path: Path, tokenizer: Tokenizer, write_jsonl: WriteJsonl
) -> None:
    """The estimation reads the first rows before any batch: its errors named no line."""
    from zephon_torch.work import TokenEstimation

    lines = ["", "", json.dumps({"text": None}), json.dumps({"text": "fine"})]
    path = write_jsonl(tmp_path / "a.jsonl", text="\n".join(lines) + "\n")
    other = write_jsonl(tmp_path / "b.jsonl", [{"text": "other"}] * 4)
    source = StaticMixtureWorkSource(
        [Dataset.from_path("jl", path), Dataset.from_path("ok", other)],
        {"jl": 1, "ok": 1},
        token_estimation=TokenEstimation(calibration_documents=2),
        shuffle=False,
    )
    pipeline = Pipeline(source).tokenize(tokenizer).pack_flat(32).batch(2)
    # the pipeline, and the loaders, which calibrate before their workers start
    for run in (pipeline, DataLoader(pipeline), DataLoader(pipeline, num_workers=1)):
        with pytest.raises(DataError) as caught:
            next(iter(run))
        assert caught.value.row == 0 and named_line(caught.value) == 3
