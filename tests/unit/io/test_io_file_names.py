"""File names under any locale: a dataset's files in the byte order of their names, and the
same fingerprint whatever encoding Python decodes file names with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT
from zephon_torch.io import Dataset

# names with capitals, digits, UTF-8 of two and three bytes, and bytes that are not UTF-8,
# whose Python text (surrogates) sorts by other rules than their bytes
_NAMES = [
    b"B.jsonl",
    b"a.jsonl",
    b"10.jsonl",
    b"9.jsonl",
    "éx.jsonl".encode(),
    b"\xa0x.jsonl",
    "ꙮ.jsonl".encode(),
    b"\xffz.jsonl",
    b"sub/a.jsonl",
    b"sub-x.jsonl",
]
# Python decoding file names as ASCII: a C locale with neither coercion nor UTF-8 mode
_ASCII_NAMES = {"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
_LISTING = (
    "import json, os, sys, warnings\n"
    "warnings.simplefilter('ignore')\n"
    "from zephon_torch.io import Dataset\n"
    "d = Dataset.from_path('d', os.fsdecode(bytes.fromhex(sys.argv[1])))\n"
    "print(json.dumps([sys.getfilesystemencoding(), d.fingerprint(),\n"
    "    [os.fsencode(s.path).hex() for s in d.shards]]))"
)


def _write_named(folder: Path) -> list[bytes]:
    """One JSONL shard of one row for each of ``_NAMES`` under ``folder``; their paths."""
    paths = []
    for name in _NAMES:
        path = os.path.join(os.fsencode(folder), name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            with open(path, "wb") as file:
                file.write(json.dumps({"text": name.hex()}).encode() + b"\n")
        except OSError as error:  # a file system that takes only UTF-8 names
            pytest.skip(f"cannot write a file named {name!r} here: {error}")
        paths.append(path)
    return paths


def _ascii_child(path: Path) -> tuple[dict[str, object], list[bytes]]:
    """The fingerprint and shard paths of a dataset opened at ``path`` by a Python that
    decodes file names as ASCII (skips where this platform gives it another encoding)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **_ASCII_NAMES}
    cmd = [sys.executable, "-c", _LISTING, os.fsencode(path).hex()]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, check=True)
    encoding, fingerprint, shards = json.loads(done.stdout)
    if encoding != "ascii":
        pytest.skip(f"Python decodes file names as {encoding} under {_ASCII_NAMES} here")
    return fingerprint, [bytes.fromhex(shard) for shard in shards]


def test_a_folder_or_glob_reads_its_files_in_the_byte_order_of_their_names(
    tmp_path: Path,
) -> None:
    """The order was that of Python's text of the names: a name that is not UTF-8 (bytes
    0xa0, 0xff as surrogates) sorted after every UTF-8 one, where a Python decoding names as
    ASCII (which sorts by bytes) put 0xa0 before é: other shard orders, so other batches."""
    paths = _write_named(tmp_path / "data")
    for path in (tmp_path / "data", tmp_path / "data" / "**" / "*.jsonl"):
        dataset = Dataset.from_path("d", path)
        assert [os.fsencode(shard.path) for shard in dataset.shards] == sorted(paths)


def test_the_order_and_fingerprint_hold_where_python_decodes_names_as_ascii(
    tmp_path: Path,
) -> None:
    """Under a C locale without UTF-8 mode a name's text is other (é as two surrogates): the
    fingerprint changed, so a state saved under a UTF-8 locale was refused there, and names
    that are not UTF-8 took other places among the rest."""
    _write_named(tmp_path / "data")
    here = Dataset.from_path("d", tmp_path / "data")
    fingerprint, shards = _ascii_child(tmp_path / "data")
    assert shards == [os.fsencode(shard.path) for shard in here.shards]
    assert fingerprint == here.fingerprint()


_READING = (
    "import json, os, sys, warnings\n"
    "warnings.simplefilter('ignore')\n"
    "from zephon_torch.io import Dataset\n"
    "d = Dataset.from_path('d', os.fsdecode(bytes.fromhex(sys.argv[1])))\n"
    "print(json.dumps([sys.getfilesystemencoding(), d.num_rows, d.read_rows(0, [0, 1])]))"
)


@pytest.mark.parametrize("suffix", [".parquet", ".vortex"])
def test_parquet_and_vortex_files_of_utf8_names_read_where_python_decodes_names_as_ascii(
    tmp_path: Path, suffix: str
) -> None:
    """pyarrow and vortex-data open files by UTF-8 names, and Python's ASCII text of a UTF-8
    name (surrogates) is none: a healthy `Ünïcode.parquet` was a DataError saying its name was
    not valid UTF-8, under a C locale without UTF-8 mode."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tests.unit.io.test_io_formats_writers import write_vortex

    path = tmp_path / "data" / f"Ünïcode{suffix}"
    table = pa.table({"text": ["a", "b", "c"]})
    if suffix == ".parquet":
        path.parent.mkdir()
        pq.write_table(table, path)
    else:
        write_vortex(path, table)
    env = {**os.environ, "PYTHONPATH": str(ROOT), **_ASCII_NAMES}
    cmd = [sys.executable, "-c", _READING, os.fsencode(path.parent).hex()]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    encoding, rows, read = json.loads(done.stdout)
    if encoding != "ascii":
        pytest.skip(f"Python decodes file names as {encoding} under {_ASCII_NAMES} here")
    assert (rows, read) == (3, [{"text": "a"}, {"text": "b"}])
