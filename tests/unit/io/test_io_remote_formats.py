"""MDS, LitData and `.npy` datasets over fsspec (memory://): listing, row counts, eviction."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pytest

from tests.memory_store import remote_options
from tests.unit.io.test_io_formats_writers import plain, sample_rows, write_mds
from zephon_torch.errors import ConfigError, DataError
from zephon_torch.io import Dataset

COLUMNS = {"text": "str", "id": "int", "tokens": "ndarray:int32"}


def _put(local: Path) -> str:
    """Copies a local folder to a fresh memory:// folder; returns its URL."""
    root = f"/zt-{uuid.uuid4().hex[:8]}"
    fsspec.filesystem("memory").put(str(local), root, recursive=True)
    return f"memory://{root}"


def _cached(tmp_path: Path) -> list[str]:
    return sorted(p.name.split("-", 1)[1] for p in (tmp_path / "cache").glob("*-*"))


def _every_row(dataset: Dataset) -> list[dict[str, Any]]:
    return [
        plain(row)
        for number, shard in enumerate(dataset.shards)
        for row in dataset.read_rows(number, range(shard.num_rows))
    ]


def test_an_index_url_stands_for_its_folder_and_a_named_format_must_match_it(
    tmp_path: Path,
) -> None:
    url = _put(write_mds(tmp_path / "mds", sample_rows(60), COLUMNS, size_limit=1 << 10))
    local = Dataset.from_path("m", tmp_path / "mds")
    remote = Dataset.from_path("m", f"{url}/index.json", io_options=remote_options(tmp_path))
    assert remote.format == "mds" and remote.fingerprint() == local.fingerprint()
    assert remote.shards[0].path == f"{url}/shard.00000.mds"
    assert _cached(tmp_path) == ["index.json"]  # counts come from the index
    assert _every_row(remote) == _every_row(local)
    with pytest.raises(ConfigError, match=r"`format` is 'litdata' but .* holds a mds index"):
        Dataset.from_path("m", url, format="litdata", io_options=remote_options(tmp_path))
    with pytest.raises(ConfigError, match=r"`path` must be a directory holding index\.json"):
        Dataset.from_path("m", f"{url}/*.mds", format="mds", io_options=remote_options(tmp_path))
    assert (
        Dataset.from_path("m", url, format="mds", io_options=remote_options(tmp_path)).num_rows
        == 60
    )


def test_a_folder_holding_several_indexed_datasets_is_refused(tmp_path: Path) -> None:
    for name in ("a", "b"):
        write_mds(tmp_path / "many" / name, sample_rows(5), COLUMNS)
    url = _put(tmp_path / "many")
    with pytest.raises(ConfigError, match=r"holds 2 MDS/LitData datasets in subfolders"):
        Dataset.from_path("m", url, io_options=remote_options(tmp_path))


def test_an_mds_dataset_reads_through_a_cache_smaller_than_itself(tmp_path: Path) -> None:
    out = write_mds(tmp_path / "mds", sample_rows(200), COLUMNS, size_limit=1 << 11)
    largest = max(path.stat().st_size for path in out.iterdir())
    limit = 3 * largest
    remote = Dataset.from_path("m", _put(out), io_options=remote_options(tmp_path, limit))
    local = Dataset.from_path("m", out)
    assert len(remote.shards) > 6
    for _ in range(2):  # evicted shards stay readable through the reader's open maps
        assert _every_row(remote) == _every_row(local)
        cached = [p for p in (tmp_path / "cache").iterdir() if p.is_file() and p.name[0] != "."]
        assert sum(p.stat().st_size for p in cached) <= limit
        assert len(cached) < len(remote.shards)
        # evicted files the reader still maps hold disk too: at most its 2 open shards
        assert len(_evicted_but_mapped(tmp_path / "cache")) <= 2


def _evicted_but_mapped(cache: Path) -> set[str]:
    with open("/proc/self/maps", encoding="utf-8") as maps:
        return {
            line.split()[-2]
            for line in maps
            if line.rstrip().endswith("(deleted)") and str(cache) in line
        }


def test_remote_readers_keep_open_only_the_shards_an_eighth_of_the_cache_holds(
    tmp_path: Path,
) -> None:
    out = write_mds(tmp_path / "mds", sample_rows(200), COLUMNS, size_limit=1 << 11)
    largest = max(path.stat().st_size for path in out.iterdir())
    url = _put(out)
    for max_bytes, expected in ((3 * largest, 2), (8 * 5 * largest, 5), (1 << 40, 16)):
        remote = Dataset.from_path("m", url, io_options=remote_options(tmp_path, max_bytes))
        assert remote._reader._open()[0].max_open == expected  # type: ignore[attr-defined]


def test_npy_rows_are_counted_from_headers_without_downloading_tokens(tmp_path: Path) -> None:
    folder = tmp_path / "npy"
    folder.mkdir()
    np.save(folder / "a.npy", np.arange(40, dtype=np.int32).reshape(8, 5))
    np.save(folder / "b.npy", np.arange(100, 110, dtype=np.uint16))
    np.save(folder / "b.offsets.npy", np.array([0, 3, 3, 10]))
    remote = Dataset.from_path("n", _put(folder), io_options=remote_options(tmp_path))
    assert [shard.num_rows for shard in remote.shards] == [8, 3]
    assert not (tmp_path / "cache").exists()
    assert remote.read_rows(1, [2])[0]["input_ids"].tolist() == list(range(103, 110))
    assert _cached(tmp_path) == ["b.npy", "b.offsets.npy"]


@pytest.mark.parametrize("where", ["local", "remote"])
def test_a_2d_token_file_of_rows_of_no_token_is_refused_at_open(tmp_path: Path, where: str) -> None:
    """Its 128 bytes of header, no data, claimed 10**18 rows, each read and skipped as an
    empty document: a job read it for ever (about 160,000 rows a second)."""
    folder = tmp_path / "npy"
    folder.mkdir()
    np.save(folder / "a.npy", np.arange(40, dtype=np.int32).reshape(8, 5))
    np.save(folder / "b.npy", np.zeros((10**18, 0), dtype=np.int32))
    path = str(folder) if where == "local" else _put(folder)
    with pytest.raises(DataError, match=r"shape \(1000000000000000000, 0\): 10+ documents of no t"):
        Dataset.from_path("n", path, io_options=remote_options(tmp_path))


@pytest.mark.parametrize("where", ["local", "remote"])
def test_a_2d_token_file_with_an_offsets_file_beside_it_is_refused(
    tmp_path: Path, where: str
) -> None:
    """Its rows of fixed length left the offsets unused, and the documents they mark lost,
    without a word."""
    folder = tmp_path / "npy"
    folder.mkdir()
    np.save(folder / "a.npy", np.arange(40, dtype=np.int32).reshape(8, 5))
    np.save(folder / "a.offsets.npy", np.array([0, 7, 40]))
    path = str(folder) if where == "local" else _put(folder)
    with pytest.raises(DataError, match=r"shape \(8, 5\) \(rows of fixed length\), but 'a.offs"):
        Dataset.from_path("n", path, io_options=remote_options(tmp_path))
    # named alone, the token file is what was asked for, there and here alike
    alone = Dataset.from_path("n", f"{path}/a.npy", io_options=remote_options(tmp_path))
    assert alone.num_rows == 8


@pytest.mark.parametrize("where", ["local", "remote"])
def test_a_1d_token_file_named_alone_reads_with_the_offsets_beside_it(
    tmp_path: Path, where: str
) -> None:
    """A local path finds them beside the file; a URL's listing held the named file alone, so
    it was refused for lacking them. Not shards of their own, and a pickled copy (a worker's)
    reads them too."""
    import pickle

    folder = tmp_path / "npy"
    folder.mkdir()
    np.save(folder / "a.npy", np.arange(100, 110, dtype=np.uint16))
    np.save(folder / "a.offsets.npy", np.array([0, 3, 3, 10]))
    np.save(folder / "b.npy", np.arange(10, dtype=np.int32))  # not read: another file
    path = str(folder) if where == "local" else _put(folder)
    alone = Dataset.from_path("n", f"{path}/a.npy", io_options=remote_options(tmp_path))
    assert [shard.path for shard in alone.shards] == [f"{path}/a.npy"]
    assert alone.num_rows == 3
    for dataset in (alone, pickle.loads(pickle.dumps(alone))):
        assert [ids.tolist() for ids in dataset.read_tokens(0, [0, 1, 2], "input_ids")] == [
            [100, 101, 102],
            [],
            list(range(103, 110)),
        ]
    if where == "remote":
        assert _cached(tmp_path) == ["a.npy", "a.offsets.npy"]


@pytest.mark.parametrize("where", ["local", "remote"])
def test_npy_columns_without_input_ids_are_refused_at_the_open(tmp_path: Path, where: str) -> None:
    """A remote open counted rows from the headers without the reader's check of the columns
    asked for: it opened, and each read failed, possibly hours into a run."""
    folder = tmp_path / "npy"
    folder.mkdir()
    np.save(folder / "a.npy", np.arange(40, dtype=np.int32).reshape(8, 5))
    path = str(folder) if where == "local" else _put(folder)
    with pytest.raises(DataError, match=r"a\.npy'?: has no column 'text'; its columns are \['in"):
        Dataset.from_path("n", path, columns=["text"], io_options=remote_options(tmp_path))
    kept = Dataset.from_path("n", path, columns=["input_ids"], io_options=remote_options(tmp_path))
    assert kept.read_rows(0, [7])[0]["input_ids"].tolist() == list(range(35, 40))


@pytest.mark.parametrize("where", ["local", "remote"])
@pytest.mark.parametrize("pattern", ["?.npy", "**/?.npy", "[bc].npy"])
def test_a_glob_naming_1d_token_files_reads_the_offsets_beside_them(
    tmp_path: Path, where: str, pattern: str
) -> None:
    """A glob that leaves the offsets files out: a local path's reader finds them beside the
    token files; a URL's listing held the token files alone, so the open refused the 1-D ones
    for lacking them. A 2-D file's offsets beside it, not named, are left alone here too."""
    import pickle

    folder = tmp_path / "npy"
    (folder / "sub").mkdir(parents=True)
    np.save(folder / "a.npy", np.arange(40, dtype=np.int32).reshape(8, 5))
    np.save(folder / "a.offsets.npy", np.array([0, 7, 40]))
    np.save(folder / "b.npy", np.arange(100, 110, dtype=np.uint16))
    np.save(folder / "b.offsets.npy", np.array([0, 3, 3, 10]))
    np.save(folder / "sub" / "c.npy", np.arange(7, dtype=np.int64))
    np.save(folder / "sub" / "c.offsets.npy", np.array([0, 2, 7]))
    path = str(folder) if where == "local" else _put(folder)
    dataset = Dataset.from_path("n", f"{path}/{pattern}", io_options=remote_options(tmp_path))
    expected = {
        "?.npy": {"a.npy": 8, "b.npy": 3},
        "**/?.npy": {"a.npy": 8, "b.npy": 3, "sub/c.npy": 2},
        "[bc].npy": {"b.npy": 3},
    }[pattern]
    shards = {shard.path[len(path) + 1 :]: shard.num_rows for shard in dataset.shards}
    assert shards == expected
    number = list(shards).index("b.npy")
    for copy in (dataset, pickle.loads(pickle.dumps(dataset))):
        assert [ids.tolist() for ids in copy.read_tokens(number, [0, 2], "input_ids")] == [
            [100, 101, 102],
            list(range(103, 110)),
        ]


@pytest.mark.parametrize(
    ("offsets", "message"),
    [
        (None, r"1-D with its document boundaries in 'flat\.offsets\.npy'"),
        (np.array([0, 4, 3, 10]), r"offsets in 'flat\.offsets\.npy' must rise"),
    ],
    ids=["missing", "falling"],
)
def test_bad_npy_offsets_raise_a_data_error_naming_the_url(
    tmp_path: Path, offsets: np.ndarray | None, message: str
) -> None:
    folder = tmp_path / "npy"
    folder.mkdir()
    np.save(folder / "flat.npy", np.arange(10))
    if offsets is not None:
        np.save(folder / "flat.offsets.npy", offsets)
    url = _put(folder)
    with pytest.raises(DataError, match=message) as caught:
        dataset = Dataset.from_path("n", url, io_options=remote_options(tmp_path))
        dataset.read_rows(0, [0])  # offsets are checked on the first read
    assert caught.value.shard == f"{url}/flat.npy"


@pytest.mark.parametrize(
    "offsets", [np.array([0, 3, 9]), np.array([1, 3, 10])], ids=["end", "start"]
)
def test_npy_offsets_that_miss_the_token_count_are_refused_at_open(
    tmp_path: Path, offsets: np.ndarray
) -> None:
    folder = tmp_path / "npy"
    folder.mkdir()
    np.save(folder / "flat.npy", np.arange(10, dtype=np.int32))
    np.save(folder / "flat.offsets.npy", offsets)
    url = _put(folder)
    with pytest.raises(DataError, match=r"offsets in 'flat\.offsets\.npy' must rise") as caught:
        Dataset.from_path("n", url, io_options=remote_options(tmp_path))  # no read needed
    assert caught.value.shard == f"{url}/flat.npy"


def _claims_nine_offsets(folder: Path) -> None:
    raw = (folder / "flat.offsets.npy").read_bytes()
    end = raw.index(b"\n") + 1  # a header of the same length, claiming 9 values of the 3
    (folder / "flat.offsets.npy").write_bytes(raw[:end].replace(b"(3,)", b"(9,)") + raw[end:])


def _cut(name: str, nbytes: int) -> Any:
    def cut(folder: Path) -> None:
        (folder / name).write_bytes((folder / name).read_bytes()[:-nbytes])

    return cut


@pytest.mark.parametrize(
    ("spoil", "named"),
    [
        (_claims_nine_offsets, "'flat.offsets.npy'"),
        (_cut("flat.offsets.npy", 4), "'flat.offsets.npy'"),
        (_cut("flat.npy", 8), "'flat.npy'"),
        (_cut("rows.npy", 20), "'rows.npy'"),
    ],
    ids=["offsets-header-claims-more", "offsets-last-value-cut", "tokens-cut", "2d-tokens-cut"],
)
def test_npy_files_shorter_than_their_headers_say_are_a_data_error_at_open(
    tmp_path: Path, spoil: Any, named: str
) -> None:
    """The offsets' values were read by range past the end, as a storage fault: retried, then
    a StorageError (on S3 a bare OSError, range not satisfiable); a short token file gave its
    header's row count at open, and failed only when read."""
    folder = tmp_path / "npy"
    folder.mkdir()
    np.save(folder / "flat.npy", np.arange(30, dtype=np.int32))
    np.save(folder / "flat.offsets.npy", np.array([0, 10, 30]))
    np.save(folder / "rows.npy", np.arange(30, dtype=np.int32).reshape(6, 5))
    spoil(folder)
    url = _put(folder)
    wait = {**remote_options(tmp_path), "retry": {"attempts": 2, "initial_delay": 30.0}}
    with pytest.raises(
        DataError, match=rf"{named} is shorter than its \.npy header says"
    ) as caught:
        Dataset.from_path("n", url, io_options=wait)  # no read needed, and no retry
    assert caught.value.dataset == "n"
    assert caught.value.shard in (f"{url}/flat.npy", f"{url}/rows.npy")


def test_a_short_read_of_an_npy_offset_is_a_data_error_not_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An offsets file cut after it was listed gave numpy's ValueError (buffer is smaller than
    requested size), retried as a storage fault, then a StorageError."""
    folder = tmp_path / "npy"
    folder.mkdir()
    np.save(folder / "flat.npy", np.arange(30, dtype=np.int32))
    np.save(folder / "flat.offsets.npy", np.array([0, 10, 30]))
    url = _put(folder)
    memory = type(fsspec.filesystem("memory"))
    original = memory.cat_file
    reads = []

    def cut(self: Any, path: str, start: Any = None, end: Any = None, **kw: Any) -> Any:
        reads.append((path, start))
        return original(self, path, start=start, end=end, **kw)[:-1]

    monkeypatch.setattr(memory, "cat_file", cut)
    wait = {**remote_options(tmp_path), "retry": {"attempts": 2, "initial_delay": 30.0}}
    with pytest.raises(DataError, match=r"'flat\.offsets\.npy' gave 7 of the 8 bytes") as caught:
        Dataset.from_path("n", url, io_options=wait)
    assert caught.value.shard == f"{url}/flat.npy"
    assert len([read for read in reads if read[1]]) == 1  # the value, once (headers: from 0)


def file_systems_made(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The URLs each fsspec file system is made for from now on (through `url_to_fs`)."""
    made: list[str] = []
    original_url_to_fs = fsspec.core.url_to_fs

    def counted(*args: Any, **kw: Any) -> Any:
        made.append(args[0])
        return original_url_to_fs(*args, **kw)

    monkeypatch.setattr(fsspec.core, "url_to_fs", counted)
    return made


def test_index_json_is_read_once_and_the_listing_file_system_is_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _put(write_mds(tmp_path / "mds", sample_rows(30), COLUMNS, size_limit=1 << 10))
    memory = type(fsspec.filesystem("memory"))
    reads: list[str] = []
    for method in ("cat_file", "get_file"):
        original = getattr(memory, method)

        def recorded(self: Any, path: str, *args: Any, _call: Any = original, **kw: Any) -> Any:
            reads.append(path.rsplit("/", 1)[-1])
            return _call(self, path, *args, **kw)

        monkeypatch.setattr(memory, method, recorded)
    made = file_systems_made(monkeypatch)
    remote = Dataset.from_path("m", url, io_options=remote_options(tmp_path))
    assert remote.num_rows == 30
    assert reads == ["index.json"]  # told the format, then went into the cache as it was
    assert _cached(tmp_path) == ["index.json"]
    local = Dataset.from_path("m", tmp_path / "mds")
    assert _every_row(remote) == _every_row(local)
    assert reads.count("index.json") == 1
    assert len(made) == 1  # the shards came through the file system that listed them


def test_narrowed_and_reconfigured_copies_read_through_the_listing_file_system(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pipeline reads a dataset narrowed to its fields (`reading`), or with its own
    `io_options`: each copy made a file system of its own at its first read (with s3fs, a
    client: 0.1-0.2 s of CPU in the middle of the run)."""
    url = _put(write_mds(tmp_path / "mds", sample_rows(30), COLUMNS, size_limit=1 << 10))
    made = file_systems_made(monkeypatch)
    options = {**remote_options(tmp_path), "retry": {"attempts": 2}}
    remote = Dataset.from_path("m", url, io_options=options)
    assert len(made) == 1
    local = Dataset.from_path("m", tmp_path / "mds")
    narrowed = remote.reading(["tokens"], "tokens")
    retried = remote.with_io_options({"retry": {"attempts": 3}})
    assert narrowed is not remote and retried is not remote
    assert _every_row(narrowed) == _every_row(local.reading(["tokens"], "tokens"))
    assert _every_row(retried) == _every_row(local)
    assert len(made) == 1


@pytest.mark.parametrize(
    "content",
    [
        b"this is not parquet, just some text\n" * 10,
        b"not parquet " * 10_000,  # longer than the footer read from the end
        b"PAR",
        b"",
        b"PAR1" + b"x" * 100 + b"PAR1",  # the magic bytes, a footer length past the start
    ],
    ids=["text", "long", "short", "empty", "bad-length"],
)
def test_a_remote_file_that_is_not_parquet_is_the_local_data_error(
    tmp_path: Path, content: bytes
) -> None:
    """A `.parquet` file that is not Parquet was refused on memory:// (or S3) in words of its
    own ('the file does not end in the Parquet magic bytes', '3 bytes is too short') where
    the same file read locally gave pyarrow's ('Parquet magic bytes not found in footer.
    Either the file is corrupted or this is not a parquet file.'). Both give pyarrow's now,
    naming the dataset and the shard."""
    local = tmp_path / "data" / "part-0.parquet"
    local.parent.mkdir()
    local.write_bytes(content)
    url = _put(local.parent)
    errors = []
    for where in (str(local), f"{url}/part-0.parquet"):
        with pytest.raises(DataError) as raised:
            Dataset.from_path("odd", where, io_options=remote_options(tmp_path))
        errors.append(str(raised.value).replace(where, "SHARD"))
    assert errors[0].startswith("dataset 'odd', shard 'SHARD': not a readable Parquet file: ")
    assert errors[1] == errors[0]
