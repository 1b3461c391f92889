"""`zephon-torch inspect` and `index`: the printed facts, the cached line indexes, clean errors."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.helpers import CountingScan, bound_by_modes
from zephon_torch import _inspect
from zephon_torch.cli import main
from zephon_torch.io import Dataset, _line_index

pytestmark = pytest.mark.usefixtures("private_cache")


def write_jsonl_shards(folder: Path, shards: int, rows: int) -> Path:
    folder.mkdir()
    for shard in range(shards):
        lines = [
            json.dumps({"id": shard * rows + i, "text": f"doc {i} " + "word " * (i * 30)})
            for i in range(rows)
        ]
        (folder / f"part-{shard:03d}.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def write_parquet(path: Path) -> Path:
    table = pa.table(
        {
            "input_ids": pa.array([list(range(40)), [7, 8]], type=pa.list_(pa.int32())),
            "source": ["web", None],
        }
    )
    pq.write_table(table, path)
    return path


def test_inspect_prints_format_shards_rows_fields_and_a_truncated_preview(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = write_jsonl_shards(tmp_path / "corpus", shards=12, rows=5)
    assert main(["inspect", str(folder), "--rows", "5"]) == 0
    out = capsys.readouterr().out
    assert "format:  jsonl" in out
    assert "shards:  12" in out
    assert "rows:    60" in out
    assert "  id: int" in out and "  text: str" in out
    assert "part-009.jsonl" in out and "part-010.jsonl" not in out
    assert "... and 2 more shards with 10 rows" in out
    assert "first 5 rows:" in out
    # Row 4's text has 126 words: cut at ~200 characters, with its full length given.
    assert "... (" in out and "chars)" in out
    assert max(len(line) for line in out.splitlines()) < 260
    for rows in ("0", "-1"):  # accepted before: no preview, and "types from the first 1 rows"
        with pytest.raises(SystemExit) as caught:
            main(["inspect", str(folder), "--rows", rows])
        assert caught.value.code == 2


def test_inspect_summarises_parquet_token_lists_and_mixed_types(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_parquet(tmp_path / "tokens.parquet")
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "format:  parquet" in out
    assert "rows:    2" in out
    assert "  input_ids: list[int]" in out
    assert "  source: str | null" in out
    assert "input_ids: list of 40 [0, 1, 2, 3, 4, 5, 6, 7, ...]" in out
    assert "windows:" not in out


def test_inspect_says_how_big_parquet_shards_are_split_for_shuffle_windows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from zephon_torch.io import parquet

    table = pa.table({"text": [f"row {i}" for i in range(40)]})
    pq.write_table(table, tmp_path / "big.parquet", row_group_size=10)
    monkeypatch.setattr(parquet, "WINDOW_BLOCK_BYTES", 1)  # every group a block
    assert main(["inspect", str(tmp_path / "big.parquet")]) == 0
    out = capsys.readouterr().out
    assert "windows: 1 of 1 shards split into 4 blocks of row groups" in out


def test_arrays_are_previewed_as_dtype_shape_and_first_values() -> None:
    assert _inspect.preview(np.arange(20, dtype=np.int32)) == (
        "int32 shape=[20] [0, 1, 2, 3, 4, 5, 6, 7, ...]"
    )
    assert _inspect.type_name(np.zeros((2, 3), dtype=np.uint16)) == "ndarray[uint16, 2-D]"


def test_a_field_nested_hundreds_of_lists_deep_is_inspected_and_validated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Valid JSON nests deeper than the type names could recurse (two frames a level): the
    field's type is cut at a few levels, and the rows are read and checked, not a traceback."""
    folder = tmp_path / "trees"
    folder.mkdir()
    deep = "[" * 600 + "1" + "]" * 600
    rows = [f'{{"text": "a parse tree", "tree": {deep}}}', '{"text": "flat", "tree": [1]}']
    (folder / "part-000.jsonl").write_text("\n".join(rows) + "\n")
    assert main(["inspect", str(folder), "--validate", "--text-field", "text"]) == 0
    out = capsys.readouterr().out
    assert "  tree: list[list[list[list[list[...]]]]] | list[int]" in out
    assert "validate: no bad row: read 2 rows" in out


def test_one_row_and_one_shard_are_said_in_the_singular(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """ "types from the first 1 rows" and "1 shard were indexed already" (trial C)."""
    folder = write_jsonl_shards(tmp_path / "one", shards=1, rows=1)
    cache = tmp_path / "idx"
    assert main(["inspect", str(folder), "--index-cache-dir", str(cache)]) == 0
    assert "fields (types from the first row):" in capsys.readouterr().out
    assert main(["index", str(folder), "--index-cache-dir", str(cache)]) == 0
    assert "1 shard was indexed already (no scan): 1 row in" in capsys.readouterr().out


def test_index_caches_every_shard_so_the_next_open_scans_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = write_jsonl_shards(tmp_path / "corpus", shards=3, rows=4)
    cache = tmp_path / "idx"
    counter = CountingScan()
    monkeypatch.setattr(_line_index, "scan_lines", counter)
    assert main(["index", str(folder), "--index-cache-dir", str(cache)]) == 0
    out = capsys.readouterr().out
    assert "indexed 3 shards: 12 rows" in out
    assert counter.calls == 3
    assert len(list(cache.rglob("*.npy"))) == 3
    reopened = Dataset.from_path("c", folder, index_cache_dir=str(cache))
    assert counter.calls == 3
    assert reopened.num_rows == 12
    assert main(["index", str(folder), "--index-cache-dir", str(cache)]) == 0
    # it said "indexed 3 shards (3 were cached already)", having indexed none (trial)
    assert "3 shards were indexed already (no scan): 12 rows" in capsys.readouterr().out
    assert counter.calls == 3
    next(folder.glob("*.jsonl")).write_text('{"text": "changed"}\n')
    assert main(["index", str(folder), "--index-cache-dir", str(cache)]) == 0
    assert "indexed 1 of 3 shards (2 were already): 9 rows" in capsys.readouterr().out
    assert counter.calls == 4


def test_index_uses_the_default_cache_that_from_path_reads(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    private_cache: Path,
) -> None:
    folder = write_jsonl_shards(tmp_path / "corpus", shards=2, rows=3)
    assert main(["index", str(folder)]) == 0
    assert str(private_cache) in capsys.readouterr().out
    counter = CountingScan()
    monkeypatch.setattr(_line_index, "scan_lines", counter)
    assert Dataset.from_path("c", folder).num_rows == 6
    assert counter.calls == 0


def test_index_says_a_format_without_line_indexes_needs_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_parquet(tmp_path / "tokens.parquet")
    assert main(["index", str(path)]) == 0
    out = capsys.readouterr().out
    assert "format 'parquet' needs no index" in out
    assert "(1 shard, " in out  # not "1 shards"


def test_index_of_remote_parquet_remembers_its_row_counts_for_later_opens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fs = fsspec.filesystem("memory")
    root = f"/zt-{uuid.uuid4().hex[:8]}"
    for number in range(2):
        fs.pipe(
            f"{root}/{number}.parquet", write_parquet(tmp_path / f"{number}.parquet").read_bytes()
        )
    cache = tmp_path / "idx"
    assert main(["index", f"memory://{root}", "--index-cache-dir", str(cache)]) == 0
    out = capsys.readouterr().out
    assert "remembered the row counts of 2 shards" in out and str(cache) in out
    assert len(list(cache.rglob("*.json"))) == 2


def test_index_of_remote_data_whose_row_counts_cannot_be_kept_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`index` said "later opens read only the listing" and exit 0 where nothing was kept: a
    cache folder whose `remote-rows` could not be written (the open skips it), or a server
    that lists its objects without a version (counted at every open, kept nowhere)."""
    from tests.helpers import serve_without_versions

    fs = fsspec.filesystem("memory")
    root = f"/zt-{uuid.uuid4().hex[:8]}"
    fs.pipe(f"{root}/0.parquet", write_parquet(tmp_path / "0.parquet").read_bytes())
    fs.pipe(f"{root}/1.jsonl", b'{"i": 1}\n{"i": 2}\n')
    cache = tmp_path / "idx"
    cache.mkdir()
    (cache / "remote-rows").write_text("a file where the folder should be")
    for url in (f"memory://{root}/0.parquet", f"memory://{root}/1.jsonl"):
        assert main(["index", url, "--index-cache-dir", str(cache)]) == 2
        err = capsys.readouterr().err
        assert "the row counts of 1 of 1 shards (e.g. memory://" in err
        assert f"could not be written to the index cache {cache}" in err

    served = tmp_path / "served"
    served.mkdir()
    write_parquet(served / "data.parquet")
    with serve_without_versions(served) as base, pytest.warns(UserWarning, match="without a"):
        code = main(["index", f"{base}/data.parquet", "--index-cache-dir", str(tmp_path / "i2")])
    assert code == 2
    assert "without a version (ETag or modification time)" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["inspect", "index"])
def test_a_missing_path_gives_one_error_line_and_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    assert main([command, str(tmp_path / "nowhere")]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1
    assert captured.err.startswith(f"zephon-torch {command}: error: no files found")
    assert "Traceback" not in captured.err


@pytest.mark.parametrize("command", ["inspect", "index", "inspect --validate"])
def test_a_file_that_may_not_be_read_gives_one_error_line_and_exit_code_2(
    tmp_path: Path, command: str
) -> None:
    """A `PermissionError` came out as a traceback and exit code 1, which from
    `inspect --validate` says a row is bad."""
    path = write_jsonl_shards(tmp_path / "data", 2, 3) / "part-001.jsonl"
    path.chmod(0)
    try:
        done = bound_by_modes([sys.executable, "-m", "zephon_torch", *command.split(), str(path)])
    finally:
        path.chmod(0o644)
    name = command.split(maxsplit=1)[0]
    assert done.returncode == 2
    assert done.stderr == f"zephon-torch {name}: error: [Errno 13] Permission denied: '{path}'\n"


def test_a_file_not_of_the_given_format_gives_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_parquet(tmp_path / "tokens.parquet")
    assert main(["inspect", str(path), "--format", "jsonl"]) == 2
    assert "error: dataset 'tokens.parquet'" in capsys.readouterr().err


def test_a_malformed_row_is_named_by_its_line_as_a_run_names_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run's error said "(line 4 of the file)", inspect's only "row 2" (a fresh-user trial):
    blank lines come before it."""
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "a"}\n\n{"text": "b"}\n{"text": \n')
    assert main(["inspect", str(path)]) == 2
    assert "row 2: malformed JSON" in (err := capsys.readouterr().err)
    assert err.rstrip().endswith("(line 4 of the file)")


def test_storage_options_reach_the_url_s_file_system(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("s3fs")
    from zephon_torch._moto import moto_server, upload

    write_jsonl_shards(tmp_path / "local", shards=2, rows=4)
    with moto_server() as (endpoint, _):
        upload(endpoint, tmp_path / "local", "bucket", "corpus")
        options = {
            "key": "x",
            "secret": "x",
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        }
        url = "s3://bucket/corpus"
        assert main(["inspect", url, "--storage-options", json.dumps(options)]) == 0
        out = capsys.readouterr().out
        assert "format:  jsonl" in out and "rows:    8" in out
        assert main(["index", url, "--storage-options", json.dumps(options)]) == 0
        assert "indexed 2 shards" in capsys.readouterr().out
    with pytest.raises(SystemExit) as bad:
        main(["inspect", url, "--storage-options", "{'key': 1}"])
    assert bad.value.code == 2
    assert "--storage-options: not JSON" in capsys.readouterr().err


def test_columns_leave_out_an_mds_column_that_is_not_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The refusal of a `pkl` column says to leave it out with `columns=`; inspect had no way
    to, so an MDS dataset with one could not be inspected at all."""
    from tests.unit.io.test_io_formats_writers import write_mds

    rows = [{"text": f"row {i}", "meta": {"i": i}} for i in range(4)]
    out = write_mds(tmp_path / "mds", rows, {"text": "str", "meta": "pkl"})
    assert main(["inspect", str(out)]) == 2
    assert "leave it out with `columns=`" in capsys.readouterr().err
    assert main(["inspect", str(out), "--columns", "text"]) == 0
    printed = capsys.readouterr().out
    assert "rows:    4" in printed and "  text: str" in printed and "meta" not in printed
    assert main(["index", str(out), "--columns", "text"]) == 0


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def test_a_file_system_that_cannot_connect_when_made_is_one_storage_error_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An ftp:// file system connects in its constructor: the refused connection was a
    50-line traceback and exit code 1."""
    url = f"ftp://127.0.0.1:{_closed_port()}/x.jsonl"
    assert main(["inspect", url]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"zephon-torch inspect: error: {url}: cannot connect: ")
    assert "ConnectionRefusedError" in err


def test_index_into_a_cache_that_cannot_be_written_is_an_error_not_a_success(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The open only warned that it could not write the line indexes, and index printed
    "indexed 3 shards" with exit code 0: nothing was cached, the next open scanned again."""
    folder = write_jsonl_shards(tmp_path / "corpus", shards=3, rows=4)
    (tmp_path / "file").write_text("")
    cache = tmp_path / "file" / "sub"  # under a regular file: cannot be made, even as root
    assert main(["index", str(folder), "--index-cache-dir", str(cache)]) == 2
    captured = capsys.readouterr()
    assert "indexed" not in captured.out
    assert captured.err.count("\n") == 1
    assert captured.err.startswith(
        f"zephon-torch index: error: the line indexes of 3 of 3 shards could not be written to "
        f"the index cache {cache}"
    )


def test_inspect_piped_into_head_ends_quietly(tmp_path: Path, private_cache: Path) -> None:
    """`zephon-torch inspect ... | head` ended in a BrokenPipeError traceback. The preview
    (about 250 KB) outgrows a pipe's buffer (64 KiB): with 50 KB the command could write it
    all and exit 0 before `head` closed the pipe."""
    import os
    import subprocess
    import sys

    folder = write_jsonl_shards(tmp_path / "corpus", shards=4, rows=1000)
    script = (
        f"{sys.executable} -c 'import sys; from zephon_torch.cli import main; sys.exit(main())' "
        f"inspect {folder} --rows 4000 | head -c 10 > /dev/null; echo ${{PIPESTATUS[0]}}"
    )
    env = {**os.environ, "ZEPHON_TORCH_CACHE": str(private_cache.parent)}
    done = subprocess.run(
        ["bash", "-c", script], check=True, capture_output=True, text=True, env=env, timeout=120
    )
    assert done.stderr == ""
    assert done.stdout.strip() == "141"


def test_reading_data_inspect_and_index_do_not_import_torch(tmp_path: Path) -> None:
    """`import zephon_torch` brought in torch (2-5 s of a start on this machine) for every
    `zephon-torch inspect`, `index` and a script that only reads rows; the package's
    torch-bound names are now imported on first use, and still there. So did `inspect` once
    its validation checked conversations with the chat step's own check."""
    folder = write_jsonl_shards(tmp_path / "corpus", shards=1, rows=3)
    script = (
        "import sys, zephon_torch\n"
        "from zephon_torch.cli import main\n"
        "from zephon_torch.io import Dataset\n"
        "rows = Dataset.from_path('d', sys.argv[1]).read_rows(0, [2])\n"
        "codes = [main(['inspect', sys.argv[1]]), main(['index', sys.argv[1]])]\n"
        "codes.append(main(['inspect', sys.argv[1], '--validate', '--chat-field', 'm']))\n"
        "print(codes, rows[0]['id'], 'torch' in sys.modules)\n"
        "print(zephon_torch.Pipeline.__module__, 'Batch' in dir(zephon_torch), "
        "'torch' in sys.modules)\n"
    )
    printed = _python(script, str(folder))
    # --validate's rows have no conversation: exit code 1
    assert printed.splitlines()[-2:] == ["[0, 0, 1] 2 False", "zephon_torch.pipeline True True"]


def _python(script: str, *args: str) -> str:
    """What `script` printed, run in a fresh interpreter with `args`; it must succeed."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_after_a_bare_import_the_documented_submodules_are_attributes() -> None:
    """The README writes `zephon_torch.torch.DataLoader`, `zephon_torch.elastic...` and
    `zephon_torch.ops.stateful...` after `import zephon_torch`: with the torch-bound names
    imported on first use they were no attributes until something touched `Pipeline` (a
    review). A name the package lacks is still an AttributeError."""
    script = (
        "import zephon_torch\n"
        "print(zephon_torch.torch.DataLoader.__name__, "
        "zephon_torch.elastic.ElasticDistributedSampler.__name__, "
        "zephon_torch.ops.stateful.StatefulFilter.__name__, hasattr(zephon_torch, 'nope'))\n"
    )
    assert _python(script).split() == [
        "DataLoader", "ElasticDistributedSampler", "StatefulFilter", "False"
    ]  # fmt: skip
    # a submodule whose extra is not installed is no attribute (hasattr is False) and says why
    without = (
        "import sys\n"
        "sys.modules['lightning'] = None  # as if the extra were not installed\n"
        "import zephon_torch\n"
        "print(hasattr(zephon_torch, 'lightning'))\n"
        "try:\n"
        "    zephon_torch.lightning\n"
        "except AttributeError as error:\n"
        "    print(error)\n"
    )
    printed = _python(without).splitlines()
    assert printed[0] == "False" and "pip install 'zephon-torch[lightning]'" in printed[1]


def test_a_child_forked_before_the_tokenizer_code_is_imported_knows_it_is_one() -> None:
    """`fork_safe_backend` tells a forked child by the pid that imported the package; once the
    package stopped importing the tokenizer code, a child that reached it first recorded its
    own pid and left TOKENIZERS_PARALLELISM=true on (a review)."""
    script = (
        "import os, zephon_torch\n"
        "os.environ['TOKENIZERS_PARALLELISM'] = 'true'\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    from zephon_torch.ops._tokenizer import fork_safe_backend\n"
        "    fork_safe_backend()\n"
        "    print(os.environ['TOKENIZERS_PARALLELISM'], flush=True)\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
    )
    assert _python(script).split() == ["false"]


def test_the_command_line_runs_as_a_module() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "zephon_torch", "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "{demo,verify,inspect,index,state}" in done.stdout


def test_warnings_are_the_command_s_own_lines(tmp_path: Path) -> None:
    """Run as a module, a library warning named `<frozen runpy>` as its place."""
    folder = tmp_path / "twins"
    folder.mkdir()
    (folder / "part.jsonl").write_text('{"text": "a"}\n')
    with open(folder / "part.jsonl", "rb") as plain, open(folder / "part.jsonl.gz", "wb") as out:
        import gzip

        out.write(gzip.compress(plain.read()))
    done = subprocess.run(
        [sys.executable, "-m", "zephon_torch", "inspect", str(folder)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("zephon-torch: ZephonWarning: "), done.stderr
    assert "differ only by a compression ending" in done.stderr
    assert "runpy" not in done.stderr and "warn(" not in done.stderr
