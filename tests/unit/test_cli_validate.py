"""`zephon-torch inspect PATH --validate`: every row of every shard read, each bad row and each
shard unreadable past an error reported as a job would name it, and the exit code says so."""

from __future__ import annotations

import io
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon_torch import DataError, Pipeline
from zephon_torch._validate import CHUNK_ROWS, VALIDATION_FAILED_EXIT, validate
from zephon_torch.cli import main
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource

pytestmark = pytest.mark.usefixtures("private_cache")


def _jsonl(folder: Path, shards: list[list[str]]) -> Path:
    folder.mkdir()
    for number, lines in enumerate(shards):
        (folder / f"part-{number}.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def _good(i: int) -> str:
    return json.dumps({"text": f"row {i}", "ids": [1, 2, i]})


def test_each_bad_row_is_named_with_its_line_and_the_rest_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = [_good(i) for i in range(40)]
    first[4] = '{"text": "abc"'  # malformed JSON
    first[9] = '{"body": 1}'  # no text
    first[12] = '{"text": 5}'  # no string
    first[20] = json.dumps({"text": ""})  # empty: no error, counted
    first.insert(15, "")  # a blank line: rows and lines part ways after it
    first[31] = '{"text": "late"'  # row 30, line 32
    second = [_good(i) for i in range(CHUNK_ROWS + 5)]  # more than a chunk
    second[CHUNK_ROWS + 2] = '{"text": null}'
    folder = _jsonl(tmp_path / "d", [first, second])
    code = main(["inspect", str(folder), "--validate", "--text-field", "text", "--rows", "1"])
    out = capsys.readouterr().out
    assert code == VALIDATION_FAILED_EXIT == 1
    report = out[out.index("validate:") :]
    rows = 40 + CHUNK_ROWS + 5
    assert report.startswith(f"validate: 5 bad rows: read {rows:,} rows of 2 shards in ")
    assert "1 row is empty (they give no tokens)" in report
    said = [line.strip() for line in report.splitlines()[2:]]
    part = [str(folder / f"part-{n}.jsonl") for n in range(2)]
    assert said[0].startswith(f"dataset 'd', shard '{part[0]}', row 4: malformed JSON")
    assert said[1] == (
        f"dataset 'd', shard '{part[0]}', row 9: field 'text' is missing; the row has fields "
        "['body'] (line 10 of the file)"
    )
    assert said[2].endswith("row 12: field 'text' must be a string, got int (line 13 of the file)")
    assert said[3].startswith(f"dataset 'd', shard '{part[0]}', row 30: malformed JSON")
    assert said[3].endswith("(line 32 of the file)")
    assert said[4].startswith(f"dataset 'd', shard '{part[1]}', row {CHUNK_ROWS + 2}: field")
    assert len(said) == 5


def test_a_clean_dataset_exits_0_and_only_the_first_errors_are_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = _jsonl(tmp_path / "clean", [[_good(i) for i in range(10)]])
    assert main(["inspect", str(folder), "--validate", "--token-field", "ids"]) == 0
    out = capsys.readouterr().out
    assert "validate: no bad row: read 10 rows of 1 shard in " in out
    assert "field 'ids' checked in each" in out and "token ids from 0 to 9 " in out
    bad = _jsonl(tmp_path / "bad", [[json.dumps({"ids": "1 2"})] * 5])
    assert main(["inspect", str(bad), "--validate", "--token-field", "ids", "--show-errors", "2"])
    out = capsys.readouterr().out
    assert out.count("must hold a 1-D list of integer token ids") == 2
    assert "... and 3 more (--show-errors sets how many are printed)" in out


def test_stored_token_arrays_and_a_null_parquet_id(tmp_path: Path) -> None:
    folder = tmp_path / "npy"
    folder.mkdir()
    np.save(folder / "part-0.npy", np.array([5, 6, 7, 300, 9], dtype=np.int32))
    np.save(folder / "part-0.offsets.npy", np.array([0, 2, 2, 5], dtype=np.int64))
    out = io.StringIO()
    assert validate([Dataset.from_path("n", folder)], token_field="input_ids", out=out) == 0
    assert "read 3 rows" in out.getvalue() and "1 row is empty" in out.getvalue()
    assert "token ids from 5 to 300 " in out.getvalue()
    path = tmp_path / "t.parquet"
    ids = pa.array([[1, 2], [3, None], [4]], type=pa.list_(pa.int32()))
    pq.write_table(pa.table({"input_ids": ids}), path)
    out = io.StringIO()
    code = validate([Dataset.from_path("p", path)], token_field="input_ids", out=out)
    assert code == VALIDATION_FAILED_EXIT
    assert "validate: 1 bad row: read 3 rows of 1 shard" in out.getvalue()
    assert "row 1: field 'input_ids' must hold a 1-D list of integer token ids" in out.getvalue()
    assert "token ids from 1 to 4 " in out.getvalue()


def test_a_shard_damaged_after_opening_is_reported_and_the_next_one_read(tmp_path: Path) -> None:
    folder = _jsonl(tmp_path / "d", [[_good(i) for i in range(30)] for _ in range(3)])
    dataset = Dataset.from_path("d", folder)
    damaged = folder / "part-1.jsonl"
    damaged.write_bytes(damaged.read_bytes()[:100])  # cut short since it was opened
    out = io.StringIO()
    assert validate([dataset], text_field="text", out=out) == VALIDATION_FAILED_EXIT
    report = out.getvalue()
    assert report.startswith("validate: 1 shard unreadable past an error: read 60 rows of 3")
    assert f"shard '{damaged}'" in report


def test_field_checks_need_validate(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["inspect", "x", "--token-field", "ids"])
    assert caught.value.code == 2
    assert "--token-field applies with --validate" in capsys.readouterr().err


def test_a_chunk_of_many_bad_rows_is_read_row_by_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Cut around each bad row, a chunk of a misspelt field's 1,500 bad rows took one more
    level of recursion and one more read of the rest per bad row: a RecursionError, as a
    review found (and quadratic cost below that). A first row that does not read leaves no
    preview, and the pass goes on."""
    lines = [_good(i) if i % 3 else '{"text": "a"' for i in range(1500)]  # 500 bad JSON lines
    folder = _jsonl(tmp_path / "d", [lines])
    code = main(["inspect", str(folder), "--validate", "--text-field", "txt", "--show-errors", "0"])
    out = capsys.readouterr().out
    assert code == VALIDATION_FAILED_EXIT
    assert "validate: 1,500 bad rows: read 1,500 rows of 1 shard" in out  # each of them
    assert "no preview, its first rows do not read (dataset 'd', shard" in out


def test_ids_a_run_refuses_are_bad_rows(tmp_path: Path) -> None:
    folder = _jsonl(tmp_path / "d", [[json.dumps({"ids": ids}) for ids in ([1, 2], [3, -1])]])
    out = io.StringIO()
    assert validate([Dataset.from_path("d", folder)], token_field="ids", out=out) == 1
    assert "row 1: field 'ids' holds token id -1; ids must lie in [0, 2**31)" in out.getvalue()
    big = tmp_path / "big"
    big.mkdir()
    np.save(big / "part-0.npy", np.array([5, 70_000, 9], dtype=np.int64))
    np.save(big / "part-0.offsets.npy", np.array([0, 1, 3], dtype=np.int64))
    out = io.StringIO()
    assert validate([Dataset.from_path("b", big)], token_field="input_ids", out=out) == 0
    out = io.StringIO()
    stored = [Dataset.from_path("b", big)]
    assert validate(stored, token_field="input_ids", vocab_size=50_000, out=out) == 1
    assert "row 1: field 'input_ids' holds token id 70000; ids must lie in [0, 50000 (vocab" in (
        out.getvalue()
    )


def test_files_that_do_not_open_are_reported_and_the_others_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file damaged before the open (a cut Parquet footer) failed the whole open: one error,
    the other files unread (a review found `--validate` stopping at the first)."""
    folder = tmp_path / "pq"
    folder.mkdir()
    for number in range(3):
        table = pa.table({"text": [f"row {i}" for i in range(10)]})
        pq.write_table(table, folder / f"part-{number}.parquet")
    for number in (0, 2):
        path = folder / f"part-{number}.parquet"
        path.write_bytes(path.read_bytes()[:40])
    assert main(["inspect", str(folder)]) == 2  # without --validate: the open's error
    capsys.readouterr()
    assert main(["inspect", str(folder), "--validate", "--text-field", "text"]) == 1
    out = capsys.readouterr().out
    assert f"{folder} does not open as a whole; --validate opens its 3 files one by one" in out
    assert "validate: 2 shards unreadable past an error: read 10 rows of 3 shards" in out
    assert out.count("not a readable Parquet file") == 2


def test_a_remote_dataset_that_does_not_open_is_opened_file_by_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A URL's dataset with a damaged file ended the command at the open's one error (exit 2),
    the other files unread; a local one was opened file by file."""
    import uuid

    import fsspec

    fs = fsspec.filesystem("memory")
    root = f"/validate-{uuid.uuid4().hex[:8]}"
    for number in range(3):
        sink = io.BytesIO()
        pq.write_table(pa.table({"text": [f"row {i}" for i in range(10)]}), sink)
        data = sink.getvalue()
        fs.pipe(f"{root}/pq/part-{number}.parquet", data if number == 1 else data[:40])
        np.save(sink := io.BytesIO(), np.arange(1, 7, dtype=np.int32))
        fs.pipe(f"{root}/npy/part-{number}.npy", sink.getvalue()[: 60 if number == 1 else None])
        np.save(sink := io.BytesIO(), np.array([0, 2, 6], dtype=np.int64))
        fs.pipe(f"{root}/npy/part-{number}.offsets.npy", sink.getvalue())
    url = f"memory://{root}/pq"
    assert main(["inspect", url, "--validate", "--text-field", "text"]) == 1
    out = capsys.readouterr().out
    assert f"{url} does not open as a whole; --validate opens its 3 files one by one" in out
    assert "validate: 2 shards unreadable past an error: read 10 rows of 3 shards" in out
    assert f"shard 'memory://{root}/pq/part-0.parquet': not a readable Parquet file" in out
    # each token file with its offsets, though the URL of each names the token file alone
    url = f"memory://{root}/npy"
    assert main(["inspect", url, "--validate", "--token-field", "input_ids"]) == 1
    out = capsys.readouterr().out
    assert "opens its 3 files one by one" in out
    assert "validate: 1 shard unreadable past an error: read 4 rows of 3 shards" in out
    assert f"shard 'memory://{root}/npy/part-1.npy': not a readable .npy file" in out


def test_a_damaged_index_is_one_unreadable_shard_naming_the_dataset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its DataError, which names no dataset in the file-by-file open, ended the command
    (exit 2, no dataset named); a ConfigError before."""
    from tests.unit.io.test_io_formats_writers import write_mds

    folder = tmp_path / "mds"
    write_mds(folder, [{"text": f"sample {i}"} for i in range(6)], {"text": "str"})
    index = folder / "index.json"
    index.write_text(index.read_text()[:30])
    assert main(["inspect", str(folder), "--validate", "--text-field", "text"]) == 1
    out = capsys.readouterr().out
    assert f"{folder} does not open: its index does not read" in out
    assert "validate: 1 shard unreadable past an error: read 0 rows of 1 shard" in out
    assert f"dataset 'mds', shard '{index}': does not read as an MDS or LitData index" in out


def test_npy_files_open_with_their_offsets_and_files_without_rows_are_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Opened one by one, each `.offsets.npy` was a shard of its own (three false errors) and
    a Parquet file without rows, which the whole open leaves out, an unreadable one (a
    review)."""
    folder = tmp_path / "npy"
    folder.mkdir()
    for number in range(3):
        np.save(folder / f"part-{number}.npy", np.arange(1, 7, dtype=np.int32))
        np.save(folder / f"part-{number}.offsets.npy", np.array([0, 2, 6], dtype=np.int64))
    damaged = folder / "part-1.npy"
    damaged.write_bytes(damaged.read_bytes()[:60])
    assert main(["inspect", str(folder), "--validate", "--token-field", "input_ids"]) == 1
    out = capsys.readouterr().out
    assert "opens its 3 files one by one" in out
    assert "validate: 1 shard unreadable past an error: read 4 rows of 3 shards" in out
    folder = tmp_path / "pq"
    folder.mkdir()
    for name, rows in (("a", 5), ("b", 5), ("c", 0)):
        pq.write_table(
            pa.table({"text": [f"row {i}" for i in range(rows)]}), folder / f"{name}.parquet"
        )
    cut = folder / "b.parquet"
    cut.write_bytes(cut.read_bytes()[:40])
    assert main(["inspect", str(folder), "--validate", "--text-field", "text"]) == 1
    out = capsys.readouterr().out
    assert "validate: 1 shard unreadable past an error: read 5 rows of 2 shards" in out
    assert "has no rows" not in out
    # one damaged file alone: a bad shard found (1), not the command failing (2)
    assert main(["inspect", str(cut), "--validate", "--text-field", "text"]) == 1
    assert "validate: 1 shard unreadable past an error: read 0 rows of 1 shard" in (
        capsys.readouterr().out
    )


def _turn(role: str, content: object = "hi") -> dict[str, object]:
    return {"role": role, "content": content}


def test_conversations_are_checked_as_tokenize_chat_takes_them_and_counted_by_role(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = [_turn("system"), _turn("user"), _turn("assistant")]
    rows: list[object] = [{"messages": good} for _ in range(8)]
    rows[1] = {"text": "no conversation"}  # field missing
    rows[2] = {"messages": "hi"}  # not a list
    rows[3] = {"messages": [_turn("user"), _turn("assistant", 7)]}  # content an int
    rows[4] = {"messages": []}  # empty: no error, no tokens
    rows[5] = {"messages": [_turn("human"), _turn("gpt")]}  # roles chatml refuses
    rows[6] = {"messages": [_turn("user")]}  # nothing to train on
    folder = _jsonl(tmp_path / "sft", [[json.dumps(row) for row in rows]])
    code = main(["inspect", str(folder), "--validate", "--chat-field", "messages", "--rows", "1"])
    out = capsys.readouterr().out
    assert code == VALIDATION_FAILED_EXIT
    report = out[out.index("validate:") :].splitlines()
    assert report[0].startswith("validate: 3 bad rows: read 8 rows of 1 shard in ")
    assert report[0].endswith("field 'messages' checked in each")
    shard = f"dataset 'sft', shard '{folder / 'part-0.jsonl'}'"
    assert [line.strip() for line in report[1:]] == [
        "1 row is empty (they give no tokens)",
        "messages by role: 'user' 3, 'system' 2, 'assistant' 2, 'human' 1, 'gpt' 1",
        "roles the built-in chatml template (tokenize_chat's default) refuses: 'human', "
        "'gpt'; rename them with a map before tokenize_chat, or pass a template of your own",
        "2 conversations have no 'assistant' message: with chatml nothing of them is trained "
        "on (every label -100)",
        f"{shard}, row 1: field 'messages' is missing; the row has fields ['text'] (line 2 of "
        "the file)",
        f"{shard}, row 2: field 'messages' must be a list of {{'role': str, 'content': str}}: "
        "it is a str (line 3 of the file)",
        f"{shard}, row 3: field 'messages' must be a list of {{'role': str, 'content': str}}: "
        "message 1's 'content' is an int (line 4 of the file)",
    ]


def test_a_bad_conversation_is_reported_as_the_run_would_stop_on_it(
    tmp_path: Path, tokenizer: Any
) -> None:
    """The same words for the same row as the pipeline's error: what validate passes,
    tokenize_chat takes."""
    rows = [[_turn("user"), _turn("assistant")], [_turn("user"), {"content": "no role"}]]
    table = pa.table({"messages": rows})  # a list<struct> column, as SFT sets are stored
    pq.write_table(table, tmp_path / "sft.parquet")
    dataset = Dataset.from_path("sft", tmp_path / "sft.parquet")
    out = io.StringIO()
    assert validate([dataset], chat_field="messages", out=out) == VALIDATION_FAILED_EXIT
    said = out.getvalue().splitlines()[-1].strip()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the test tokenizer has no chatml markers
        pipeline = Pipeline(StaticMixtureWorkSource([dataset], shuffle=False)).tokenize_chat(
            tokenizer=tokenizer
        )
    with pytest.raises(DataError) as raised:
        list(pipeline.pack_flat(64).batch(1))
    # the run adds how to skip such rows
    assert " ".join(str(raised.value).split()).startswith(said)
    assert "row 1: field 'messages' must be a list of" in said
    assert "message 1's 'role' is None" in said  # Parquet's struct fills the missing key


def test_a_clean_chat_dataset_exits_0_and_chat_checks_need_validate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [{"messages": [_turn("user"), _turn("assistant", f"answer {i}")]} for i in range(5)]
    folder = _jsonl(tmp_path / "clean", [[json.dumps(row) for row in rows]])
    assert main(["inspect", str(folder), "--validate", "--chat-field", "messages"]) == 0
    out = capsys.readouterr().out
    assert "validate: no bad row: read 5 rows of 1 shard in " in out
    assert "messages by role: 'user' 5, 'assistant' 5" in out
    assert "refuses" not in out and "no 'assistant' message" not in out
    with pytest.raises(SystemExit) as caught:
        main(["inspect", str(folder), "--chat-field", "messages"])
    assert caught.value.code == 2
    assert "--chat-field applies with --validate" in capsys.readouterr().err
    with pytest.raises(SystemExit) as caught:
        main(["inspect", str(folder), "--validate", "--chat-field", "m", "--text-field", "t"])
    assert caught.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
