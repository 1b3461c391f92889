"""Remote datasets over http(s):// on a loopback server: files and folder pages, servers that
ignore ranges, and URLs whose credentials never show."""

from __future__ import annotations

import http.server
import json
import os
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.loopback import serve_in_thread
from tests.memory_store import remote_options
from zephon_torch.errors import ConfigError, DataError, StorageError
from zephon_torch.io import Dataset


def test_http_urls_of_a_file_and_of_a_folder_page_open_and_read(
    tmp_path: Path, http_folder: tuple[Path, str]
) -> None:
    """fsspec's http:// lists a file without details and a page's links without sizes: both
    failed with a bare KeyError or TypeError. A rewrite is seen by its Last-Modified."""
    folder, base = http_folder
    for shard in range(2):
        rows = [{"text": f"row {shard}-{i}"} for i in range(5)]
        (folder / f"part-{shard}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.utime(folder / f"part-{shard}.jsonl", (time.time() - 10,) * 2)  # settled
    options = remote_options(tmp_path)
    index = str(tmp_path / "index")
    single = Dataset.from_path("h", f"{base}/part-1.jsonl", io_options=options)
    assert single.read_rows(0, [4]) == [{"text": "row 1-4"}]
    listed = Dataset.from_path("h", f"{base}/", io_options=options, index_cache_dir=index)
    assert [listed.read_rows(n, [0])[0]["text"] for n in range(2)] == ["row 0-0", "row 1-0"]
    from tests.unit.io.test_io_formats_writers import write_mds  # an indexed folder too

    write_mds(folder / "mds", [{"text": f"sample {i}"} for i in range(6)], {"text": "str"})
    mds = Dataset.from_path("m", f"{base}/mds/", io_options=options)
    assert (mds.format, mds.num_rows) == ("mds", 6)
    assert mds.read_rows(0, [5]) == [{"text": "sample 5"}]
    # another node's cache: its open lists the object and takes its remembered row count
    other = remote_options(tmp_path / "other")
    later = Dataset.from_path("h", f"{base}/part-0.jsonl", io_options=other, index_cache_dir=index)
    path = folder / "part-0.jsonl"
    path.write_text(path.read_text().replace("row 0", "row 9"))  # same size, later
    os.utime(path, (path.stat().st_atime, path.stat().st_mtime + 10))
    with pytest.raises(DataError, match="changed since it was listed"):
        later.read_rows(0, [0])


class _Failing(http.server.BaseHTTPRequestHandler):
    """Answers every GET with 500 (a store having a bad minute); HEAD as a file of 14 bytes."""

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "14")
        self.end_headers()

    def do_GET(self) -> None:
        self.send_error(500)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_signed_http_url_is_no_glob_and_never_shows_its_credentials(
    tmp_path: Path, http_folder: tuple[Path, str]
) -> None:
    """A server error at the open of a signed URL was a ConfigError, "no files found", not
    retried (its "?" was taken for a glob), and errors printed the URL's credentials where the
    URL stood first (a review). A password before the host is blanked too."""
    folder, base = http_folder
    (folder / "a.jsonl").write_text('{"text": "x"}\n')
    os.utime(folder / "a.jsonl", (time.time() + 60,) * 2)  # not settled: a warning names it
    query = "?X-Amz-Credential=AKIAKEYID&X-Amz-Signature=SECRETSIG"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        signed = Dataset.from_path(
            "h", f"{base}/a.jsonl{query}", io_options=remote_options(tmp_path)
        )
    assert caught and all("SECRETSIG" not in str(w.message) for w in caught)
    assert signed.read_rows(0, [0]) == [{"text": "x"}]
    retry = {"attempts": 2, "initial_delay": 0.01}
    with serve_in_thread(_Failing) as failing:
        for url in (f"{failing}/a.jsonl{query}", failing.replace("//", "//al:SECRETPW@") + "/a"):
            with pytest.raises(StorageError, match=r"failed after 2 attempt") as raised:
                Dataset.from_path("h", url, format="jsonl", io_options={"retry": retry})
            text = "".join(traceback.format_exception(raised.value))
            assert all(secret not in text for secret in ("AKIAKEYID", "SECRETSIG", "SECRETPW"))
    error = DataError("bad", dataset="h", shard=f"{base}/a.jsonl{query}", row=0)
    assert "SECRETSIG" not in str(error) and error.shard == f"{base}/a.jsonl{query}"
    assert "SECRETPW" not in str(ConfigError("no files at 'https://al:SECRETPW@host/a'"))


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("https://al:pa'ss@host/a", "https://al:***@host/a"),  # a quote is legal there
        ("https://al:pa@ss@host/a?b", "https://al:***@host/a?b"),  # so is an unencoded "@"
        ("s3://bucket/a and me:you@host", "s3://bucket/a and me:you@host"),  # no URL's
        ("dataset 'x': a:b@c", "dataset 'x': a:b@c"),
    ],
)
def test_a_url_s_password_is_blanked_and_nothing_else(text: str, shown: str) -> None:
    from zephon_torch.errors import without_secrets

    assert without_secrets(text) == shown


def test_a_config_error_blanks_credentials_in_its_urls_only() -> None:
    """A repr such as `Options(token=None, key=3)` lost its values (a review)."""
    error = ConfigError("Options(token=None, key=3) at https://u:pw@h/a?sig=S&x=1")
    assert str(error) == "Options(token=None, key=3) at https://u:***@h/a?sig=***&x=1"


def test_npy_tokens_open_and_read_from_a_server_that_ignores_ranges(
    tmp_path: Path, http_folder: tuple[Path, str]
) -> None:
    """python's http.server answers a range request with the whole file: each offsets value
    read by range was refused as a file changed since its listing, so no .npy dataset opened
    over such a server (other formats did)."""
    folder, base = http_folder
    tokens = np.arange(3000, dtype=np.int32)
    for shard in range(2):
        np.save(folder / f"{shard}.npy", tokens + shard)
        np.save(folder / f"{shard}.offsets.npy", np.arange(0, 3001, 100, dtype=np.int64))
        for name in (f"{shard}.npy", f"{shard}.offsets.npy"):
            os.utime(folder / name, (time.time() - 10,) * 2)  # settled
    dataset = Dataset.from_path("t", f"{base}/", io_options=remote_options(tmp_path))
    assert (dataset.format, dataset.num_rows) == ("npy", 60)
    [row] = dataset.read_rows(1, [29])
    assert np.array_equal(np.asarray(row["input_ids"]), tokens[2900:3000] + 1)
