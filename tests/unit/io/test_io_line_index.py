"""The JSONL line index: which lines are rows, and its on-disk cache."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import CountingScan
from zephon_torch.io import Dataset, _line_index
from zephon_torch.io._line_index import load_or_build, scan_lines


def _lines(buffer: bytes) -> list[bytes]:
    return [buffer[start:end] for start, end in scan_lines(buffer).T.tolist()]


def test_blank_and_whitespace_only_lines_are_not_rows() -> None:
    buffer = b'{"a":1}\n\n   \n\t\r\n\r\n{"a":2}\n \x0c\n'
    assert _lines(buffer) == [b'{"a":1}', b'{"a":2}']


def test_a_first_line_of_a_byte_order_mark_only_is_blank(tmp_path: Path) -> None:
    """An editor's empty first line after a BOM was row 0, "malformed JSON" (trial); a BOM
    before the first row's JSON stays with that row, which parses."""
    from zephon_torch.io import Dataset

    bom = b"\xef\xbb\xbf"
    assert _lines(bom + b'\n{"a":1}\n') == [b'{"a":1}']
    assert _lines(bom + b' \r\n{"a":1}') == [b'{"a":1}']
    assert _lines(bom) == []
    assert _lines(bom + b'{"a":1}\n') == [bom + b'{"a":1}']
    assert _lines(b' \xef\xbb\xbf\n{"a":1}') == [b" \xef\xbb\xbf", b'{"a":1}']  # not first
    # inside the file, where `cat` joined files an editor began so (a review)
    assert _lines(b'{"a":1}\n' + bom + b"\r\n" + bom + b'{"a":2}') == [b'{"a":1}', bom + b'{"a":2}']
    for text in (bom + b'\n{"text": "a"}\n', bom + b'{"text": "a"}\n'):
        (tmp_path / "bom.jsonl").write_bytes(text)
        dataset = Dataset.from_path("d", tmp_path / "bom.jsonl", index_cache_dir=str(tmp_path))
        assert dataset.read_rows(0, range(dataset.num_rows)) == [{"text": "a"}]


def test_files_with_byte_order_marks_joined_by_cat_read_every_row(tmp_path: Path) -> None:
    """`cat a.jsonl b.jsonl` of files an editor started with a BOM leaves one before a row
    inside the file: that row was refused as "malformed JSON ... Expecting value" (a review),
    and skipped under bad_rows="skip"."""
    bom = b"\xef\xbb\xbf"
    one = bom + b'{"text": "a"}\n' + bom + b'{"text": "b"}\r\n'
    for name, data in (("plain.jsonl", one), ("cut.jsonl", one.rstrip())):
        (tmp_path / name).write_bytes(data)
        dataset = Dataset.from_path("d", tmp_path / name, index_cache_dir=str(tmp_path))
        assert dataset.read_rows(0, range(dataset.num_rows)) == [{"text": "a"}, {"text": "b"}]


def test_a_last_line_without_a_newline_is_a_row() -> None:
    assert _lines(b'{"a":1}\n{"a":2}') == [b'{"a":1}', b'{"a":2}']


def test_crlf_line_endings_are_left_out_of_the_rows() -> None:
    assert _lines(b'{"a":1}\r\n{"a":2}\r\n') == [b'{"a":1}', b'{"a":2}']


def test_lines_with_surrounding_whitespace_stay_whole() -> None:
    assert _lines(b'  {"a":1}  \n\t{"a":2}') == [b'  {"a":1}  ', b'\t{"a":2}']


def test_an_empty_buffer_has_no_rows() -> None:
    assert scan_lines(b"").shape == (2, 0)


def test_the_index_is_int64_start_and_end_offsets() -> None:
    index = scan_lines(b"ab\ncd\n")
    assert index.dtype == np.int64
    assert index.tolist() == [[0, 3], [2, 5]]


def test_lines_spanning_scan_chunks_are_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_line_index, "_CHUNK_BYTES", 4)
    assert _lines(b"abcdefg\nhi\n\n\njklmnopq") == [b"abcdefg", b"hi", b"jklmnopq"]


_LINE = st.text(alphabet=st.sampled_from(list(' \t\r\x0b\x0c{}"a:1é\ufeff')), max_size=12)


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(_LINE, max_size=30), trailing_newline=st.booleans())
def test_the_index_finds_exactly_the_non_blank_lines(
    lines: list[str], trailing_newline: bool
) -> None:
    buffer = "\n".join(lines).encode() + (b"\n" if trailing_newline and lines else b"")
    expected = []
    for line in buffer.split(b"\n"):
        row = line[:-1] if line.endswith(b"\r") else line
        if line.removeprefix(b"\xef\xbb\xbf").strip():  # a BOM and whitespace: blank
            expected.append(row)
    assert _lines(buffer) == expected


@pytest.fixture
def counting_scan(monkeypatch: pytest.MonkeyPatch) -> CountingScan:
    counter = CountingScan()
    monkeypatch.setattr(_line_index, "scan_lines", counter)
    return counter


def test_a_second_open_of_the_same_file_reuses_the_cached_index(
    tmp_path: Path, write_jsonl: Any, counting_scan: CountingScan
) -> None:
    path = write_jsonl(tmp_path / "data.jsonl", [{"a": i} for i in range(10)])
    cache = tmp_path / "cache"
    first = Dataset.from_path("d", path, index_cache_dir=str(cache))
    second = Dataset.from_path("d", path, index_cache_dir=str(cache))
    assert counting_scan.calls == 1
    assert first.num_rows == second.num_rows == 10
    assert second.read_rows(0, [9]) == [{"a": 9}]
    assert [p.suffix for p in cache.rglob("*") if p.is_file()] == [".npy"]


def test_the_index_is_rebuilt_when_the_file_changes(
    tmp_path: Path, write_jsonl: Any, counting_scan: CountingScan
) -> None:
    path = write_jsonl(tmp_path / "data.jsonl", [{"a": i} for i in range(10)])
    cache = str(tmp_path / "cache")
    assert Dataset.from_path("d", path, index_cache_dir=cache).num_rows == 10
    write_jsonl(path, [{"b": i} for i in range(12)])
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    changed = Dataset.from_path("d", path, index_cache_dir=cache)
    assert counting_scan.calls == 2
    assert changed.num_rows == 12
    assert changed.read_rows(0, [11]) == [{"b": 11}]


def test_indexes_of_other_versions_go_once_unused_for_a_week(
    tmp_path: Path, write_jsonl: Any, counting_scan: CountingScan
) -> None:
    """Each version of a file left its index for ever: a shard rewritten daily (or only
    `chmod`-ed, which moves its ctime) grew the index cache by one index a day. Versions in
    use stay: nodes with their own copies at one path (other inodes) may share the folder."""
    path = write_jsonl(tmp_path / "data.jsonl", [{"a": i} for i in range(10)])
    other = write_jsonl(tmp_path / "other.jsonl", [{"o": 1}])
    cache = tmp_path / "cache"
    Dataset.from_path("d", other, index_cache_dir=str(cache))
    week = 7 * 24 * 3600
    for version in range(4):
        write_jsonl(path, [{"v": version}] * (10 + version))
        os.chmod(path, 0o644 if version % 2 else 0o600)
        assert Dataset.from_path("d", path, index_cache_dir=str(cache)).num_rows == 10 + version
        if version == 1:  # the versions so far: last used over a week ago (the other file too)
            for index in cache.rglob("*.npy"):
                os.utime(index, (index.stat().st_atime - week - 60,) * 2)
    assert counting_scan.calls == 5
    # the two old ones went; the one used a moment ago stays, and so does the other file's
    assert len(list(cache.rglob("*.npy"))) == 3
    Dataset.from_path("d", other, index_cache_dir=str(cache))  # loaded: marked used
    assert counting_scan.calls == 5
    marked = Path(_line_index.cache_file(str(cache), str(other))).stat().st_mtime
    assert time.time() - marked < 60


def test_indexes_of_downloads_go_once_unused_for_a_week(
    tmp_path: Path, write_jsonl: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A download's index is named by the download (object and version): none was ever
    removed, so each version of a remote shard read left its index (16 bytes a row) for ever.
    They go as a process tidies the folder: at its first index there, then at most each 10
    minutes (a listing of the folder, not one per index written)."""
    path = write_jsonl(tmp_path / "data.jsonl", [{"a": i} for i in range(10)])
    cache = str(tmp_path / "cache")
    load_or_build(str(path), cache, path.read_bytes)  # a local file's index: not a download's
    local = Path(_line_index.cache_file(cache, str(path)))
    names = [f"{digest}-data.jsonl" for digest in ("aa01", "aa02", "aa03", "aa04", "aa05")]
    for name in names[:3]:
        load_or_build(str(path), cache, path.read_bytes, name=name)
    week = 7 * 24 * 3600
    for name in (*names[:2], None):
        index = Path(_line_index.cache_file(cache, str(path), name))
        os.utime(index, (index.stat().st_atime - week - 60,) * 2)
    load_or_build(str(path), cache, path.read_bytes, name=names[3])
    kept = {Path(_line_index.cache_file(cache, str(path), name)).exists() for name in names[:2]}
    assert kept == {True}  # tidied at the first index, not again within 10 minutes
    monkeypatch.setattr(_line_index, "_TIDIED", {})  # 10 minutes on, or another process
    load_or_build(str(path), cache, path.read_bytes, name=names[4])
    kept = {Path(_line_index.cache_file(cache, str(path), name)).exists() for name in names[:2]}
    assert kept == {False}
    assert all(Path(_line_index.cache_file(cache, str(path), n)).exists() for n in names[2:])
    assert local.exists()  # a local file's versions age out by their own path only


def test_a_file_replaced_by_one_of_the_same_size_and_mtime_is_indexed_again(
    tmp_path: Path, counting_scan: CountingScan
) -> None:
    """`cp -p`, `rsync -a` or a tar extraction keep a file's mtime: one of the same size was
    read with the other's cached line offsets, its last row silently lost."""
    path = tmp_path / "data.jsonl"
    old = b'{"t": "a"}\n{"t": "b"}\n' + b" " * 9 + b"\n"  # two rows, blank padding
    new = b'{"t": "a"}\n{"t": "b"}\n{"t":"c"}\n'
    assert len(old) == len(new)
    path.write_bytes(old)
    cache = str(tmp_path / "cache")
    assert Dataset.from_path("d", path, index_cache_dir=cache).num_rows == 2
    stat = path.stat()
    replacement = tmp_path / "incoming.jsonl"
    replacement.write_bytes(new)
    os.utime(replacement, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    os.replace(replacement, path)
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)
    replaced = Dataset.from_path("d", path, index_cache_dir=cache)
    assert replaced.read_rows(0, range(replaced.num_rows)) == [{"t": t} for t in "abc"]
    assert counting_scan.calls == 2


def test_compressed_files_are_indexed_once_too(
    tmp_path: Path, write_jsonl: Any, counting_scan: CountingScan
) -> None:
    path = write_jsonl(tmp_path / "data.jsonl.gz", [{"a": i} for i in range(5)], compression="gzip")
    Dataset.from_path("d", path)
    reopened = Dataset.from_path("d", path)
    assert counting_scan.calls == 1
    assert reopened.read_rows(0, [4, 0]) == [{"a": 4}, {"a": 0}]


@pytest.mark.parametrize("compression", [None, "gzip"])
def test_a_file_whose_name_is_not_utf8_is_indexed_and_read(
    tmp_path: Path, write_jsonl: Any, counting_scan: CountingScan, compression: str | None
) -> None:
    """A name of Latin-1 bytes (an old file system's, a tar's), as os.listdir gives it (with
    surrogates), was a bare UnicodeEncodeError where its index's cache name was made."""
    name = os.fsdecode(b"caf\xe9.jsonl" + (b".gz" if compression else b""))
    path = write_jsonl(tmp_path / name, [{"a": i} for i in range(5)], compression=compression)
    assert Dataset.from_path("d", tmp_path).read_rows(0, [4, 0]) == [{"a": 4}, {"a": 0}]
    assert Dataset.from_path("d", path).num_rows == 5
    assert counting_scan.calls == 1


def test_the_default_cache_is_under_zephon_torch_cache(
    tmp_path: Path, write_jsonl: Any, private_cache: Path
) -> None:
    Dataset.from_path("d", write_jsonl(tmp_path / "data.jsonl", [{"a": 1}]))
    assert len(list(private_cache.rglob("*.npy"))) == 1


def test_a_corrupt_cache_file_is_rebuilt(
    tmp_path: Path, write_jsonl: Any, counting_scan: CountingScan
) -> None:
    path = str(write_jsonl(tmp_path / "data.jsonl", [{"a": i} for i in range(3)]))
    cache = str(tmp_path / "cache")
    load_or_build(path, cache, lambda: Path(path).read_bytes())
    [cached] = Path(cache).glob("*/*.npy")
    cached.write_bytes(b"torn")
    index = load_or_build(path, cache, lambda: Path(path).read_bytes())
    assert index.shape == (2, 3)
    assert counting_scan.calls == 2
    assert np.load(cached).shape == (2, 3)


def test_an_unwritable_cache_still_gives_the_index(tmp_path: Path, write_jsonl: Any) -> None:
    path = write_jsonl(tmp_path / "data.jsonl", [{"a": i} for i in range(3)])
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file where the cache folder should be")
    dataset = Dataset.from_path("d", path, index_cache_dir=str(blocker / "index"))
    assert dataset.read_rows(0, [2]) == [{"a": 2}]


def test_an_unwritable_cache_is_logged_once_not_once_per_shard(
    tmp_path: Path, write_jsonl: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """`index --index-cache-dir` at a folder it cannot write said so once per shard before its
    own error (trial C): thousands of lines for a large dataset."""
    for i in range(4):
        write_jsonl(tmp_path / "data" / f"{i}.jsonl", [{"a": i}])
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file where the cache folder should be")
    with caplog.at_level("WARNING", logger=_line_index.__name__):
        dataset = Dataset.from_path("d", tmp_path / "data", index_cache_dir=str(blocker / "ix"))
    assert dataset.num_rows == 4
    said = [r.getMessage() for r in caplog.records if "cannot cache" in r.getMessage()]
    assert len(said) == 1 and "(said once; each shard is scanned at each open)" in said[0]


def test_no_temporary_files_are_left_in_the_cache(tmp_path: Path, write_jsonl: Any) -> None:
    for i in range(3):
        write_jsonl(tmp_path / "data" / f"{i}.jsonl", [{"a": i}])
    Dataset.from_path("d", tmp_path / "data", index_cache_dir=str(tmp_path / "cache"))
    files = [p.relative_to(tmp_path / "cache") for p in (tmp_path / "cache").rglob("*")]
    indexes = [p for p in files if p.suffix == ".npy"]
    assert len(indexes) == 3 and all(not p.name.startswith(".") for p in indexes)
    assert sorted(set(files) - set(indexes)) == sorted(
        {p.parent for p in indexes} | {Path(".writing")}
    )


def test_indexes_written_do_not_each_list_the_shared_folder(
    tmp_path: Path, write_jsonl: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each index written listed the whole index folder three times, so the first open of N
    files took N^2 steps (4.5 s for 1,500 small files); now each lists its own file's
    subfolder, and the folder itself is listed once per process (and 10 minutes)."""
    folder = tmp_path / "data"
    for i in range(40):
        write_jsonl(folder / f"{i}.jsonl", [{"a": i}])
    cache = tmp_path / "cache"
    listed = _count_listings(monkeypatch)
    assert Dataset.from_path("d", folder, index_cache_dir=str(cache)).num_rows == 40
    assert listed.count(str(cache)) == 1


def test_the_first_index_a_process_writes_tidies_an_earlier_layout_s_leftovers(
    tmp_path: Path, write_jsonl: Any
) -> None:
    """Indexes of the flat layout (`<path digest>-<version>.npy`) are never read again: they go
    once unused for a week, with the unlocked temporaries its writers left in the folder."""
    cache = tmp_path / "cache"
    cache.mkdir()
    week = 7 * 24 * 3600
    flat_old, flat_recent = cache / "0123456789abcdef-fedcba9876543210.npy", cache / "a-b.npy"
    for leftover in (flat_old, flat_recent, cache / ".writing-dead.npy"):
        leftover.write_bytes(b"an index")
    os.utime(flat_old, (time.time() - week - 60,) * 2)
    user_file = cache / "notes.txt"
    user_file.write_text("not an index")
    Dataset.from_path(
        "d", write_jsonl(tmp_path / "a.jsonl", [{"a": 1}]), index_cache_dir=str(cache)
    )
    assert not flat_old.exists() and not (cache / ".writing-dead.npy").exists()
    assert flat_recent.exists() and user_file.exists()


_WRITE_AN_INDEX_AND_STOP_BEFORE_ITS_RENAME = """
import os, sys, time
from zephon_torch.io import Dataset

def stop_at_the_rename(frame, event, function):
    if event == "c_call" and function is os.replace:  # the index's temporary file is written
        print("writing", flush=True)
        time.sleep(600)

sys.setprofile(stop_at_the_rename)
Dataset.from_path("d", sys.argv[1], index_cache_dir=sys.argv[2])
"""


def test_the_temporary_file_of_a_writer_killed_mid_write_is_swept_by_the_next_index(
    tmp_path: Path, write_jsonl: Any
) -> None:
    """A process killed while writing an index (a DataLoader worker or rank killed at
    start-up) left its temporary file, up to the whole index (16 bytes a row), in the folder
    for ever. A live writer's is kept (here one stopped just before its rename); a killed
    one's, whose lock went with it, goes with the next index written; so do the unlocked
    temporaries of earlier versions once a day old."""
    cache = tmp_path / "cache"
    cache.mkdir()
    earlier = [cache / ".tmp-earlier.npy", cache / ".tmp-recent.npy"]
    for leftover in earlier:
        leftover.write_bytes(b"part of an index")
    day = 24 * 3600
    os.utime(earlier[0], (time.time() - day - 60,) * 2)
    paths = [
        write_jsonl(tmp_path / f"{i}.jsonl", [{"a": j} for j in range(i + 5)]) for i in range(3)
    ]
    environment = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[3])}
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _WRITE_AN_INDEX_AND_STOP_BEFORE_ITS_RENAME,
            str(paths[0]),
            str(cache),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=environment,
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline() == "writing\n"
        [writing] = {p.name for p in (cache / ".writing").iterdir()}
        assert Dataset.from_path("d", paths[1], index_cache_dir=str(cache)).num_rows == 6
        assert (cache / ".writing" / writing).exists()  # its writer lives: kept
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait(60)
    assert Dataset.from_path("d", paths[2], index_cache_dir=str(cache)).num_rows == 7
    names = sorted(p.name for p in cache.iterdir())
    assert [name for name in names if name.startswith(".")] == [".tmp-recent.npy", ".writing"]
    assert list((cache / ".writing").iterdir()) == []
    assert len(list(cache.glob("*/*.npy"))) == 2  # and the two indexes written whole


def test_a_tidy_leaves_a_user_s_own_files_in_the_folder(tmp_path: Path, write_jsonl: Any) -> None:
    """The tidy took every `.npy` file of the folder a week old (and every `.tmp-*` file a day
    old, every unlocked `.writing-*` file): a user's arrays kept beside the indexes, or token
    shards of a shard cache given the same folder. Only the names the indexes and their
    temporaries had go, as before the subfolders."""
    cache = tmp_path / "cache"
    cache.mkdir()
    week = 7 * 24 * 3600
    mine = [cache / n for n in ("embeddings.npy", ".tmp-notes.txt", ".writing-draft.md")]
    mine.append(cache / f"{'ab' * 12}-tokens.npy")  # a shard cache's download
    ours = [cache / f"{'0' * 16}-{'1' * 16}.npy", cache / f"{'2' * 32}.npy"]
    ours += [cache / ".tmp-abc.npy", cache / ".writing-abc.npy"]
    for leftover in mine + ours:
        leftover.write_bytes(b"a file")
        os.utime(leftover, (time.time() - week - 60,) * 2)
    Dataset.from_path(
        "d", write_jsonl(tmp_path / "a.jsonl", [{"a": 1}]), index_cache_dir=str(cache)
    )
    assert [path.exists() for path in mine] == [True] * len(mine)
    assert [path.exists() for path in ours] == [False] * len(ours)


_WAIT_FOR_THE_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)  # a writer's `lock_file`, on the file its mkstemp made
print("opened", flush=True)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
"""


def test_a_child_forked_while_a_sweep_holds_a_temporary_s_lock_does_not_keep_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep (or tidy) locks a temporary to tell whether its writer lives; the descriptor
    was not tracked, so a process forked at that moment (a DataLoader worker) kept the lock
    for its life after the sweep let it go: the writer that had just made the file, waiting
    for its own lock, waited as long."""
    import select
    import threading

    from zephon_torch.io import _locks

    temporary = tmp_path / ".writing-new.npy"
    temporary.write_bytes(b"")  # made by a live writer's mkstemp, not locked yet
    locked, go = threading.Event(), threading.Event()

    class _Os:
        def __getattr__(self, name: str) -> Any:
            return getattr(os, name)

        def unlink(self, path: str) -> None:  # the sweep holds the lock here
            locked.set()
            go.wait(30)
            os.unlink(path)

    monkeypatch.setattr(_locks, "os", _Os())
    sweep = threading.Thread(target=_locks.remove_if_unlocked, args=(str(temporary),))
    sweep.start()
    assert locked.wait(30)
    writer = subprocess.Popen(
        [sys.executable, "-c", _WAIT_FOR_THE_LOCK, str(temporary)], stdout=subprocess.PIPE
    )
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # a worker, living on
        os.close(write)
        os.read(read, 1)
        os._exit(0)
    os.close(read)
    try:
        assert writer.stdout is not None and writer.stdout.readline() == b"opened\n"
        go.set()
        sweep.join(30)
        ready, _, _ = select.select([writer.stdout], [], [], 10)
        assert ready and writer.stdout.readline() == b"locked\n"
    finally:
        go.set()
        os.close(write)
        os.waitpid(child, 0)
        writer.kill()
        writer.wait(30)


def test_one_thread_tidies_a_due_folder_however_the_threads_meet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread that lost the claim of a due tidy popped the winner's time, so the next index
    written in the process (any thread) tidied the folder again at once, maybe alongside."""
    import threading

    cache = tmp_path / "cache"
    cache.mkdir()
    root = str(cache)
    release = threading.Event()

    class _Paused(dict[str, float]):
        def get(self, key: str, default: Any = None) -> Any:
            found = super().get(key, default)
            if threading.current_thread().name == "late":  # read the old time, then paused
                release.wait(5)
            return found

    monkeypatch.setattr(_line_index, "_TIDIED", _Paused({root: time.time() - 3600}))
    listed = _count_listings(monkeypatch)
    late = threading.Thread(target=_line_index._tidy, args=(root,), name="late")
    first = threading.Thread(target=_line_index._tidy, args=(root,), name="first")
    late.start()
    time.sleep(0.2)
    first.start()
    first.join(1)
    release.set()
    late.join(30)
    first.join(30)
    _line_index._tidy(root)  # the process's next index, a moment later
    assert listed.count(root) == 1


def test_a_child_forked_while_a_thread_claims_a_tidy_tidies_its_own(tmp_path: Path) -> None:
    """The claim of a tidy is held for two dict operations by whichever thread claims; a
    child forked then (a DataLoader worker) must not inherit it held, waiting for ever."""
    import threading

    cache = tmp_path / "cache"
    cache.mkdir()
    held = threading.Event()

    def claim() -> None:  # another thread of the parent claims a tidy
        with _line_index._CLAIMING:
            held.set()
            time.sleep(0.3)

    claimer = threading.Thread(target=claim)
    claimer.start()
    assert held.wait(30)
    child = os.fork()
    if child == 0:
        try:
            _line_index._TIDIED.clear()
            _line_index._tidy(str(cache))
        finally:
            os._exit(0)
    claimer.join(30)
    deadline = time.monotonic() + 30
    while os.waitpid(child, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            pytest.fail("the child waited for its parent's claim")
        time.sleep(0.01)


def _count_listings(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The folders ``os.scandir`` lists from now on, by absolute path, in a list it fills."""
    listed: list[str] = []
    scandir = os.scandir

    def counted(path: Any = ".") -> Any:
        listed.append(os.path.abspath(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", counted)
    return listed


def test_a_recent_whole_second_version_written_with_z_for_utc_is_not_settled() -> None:
    """A same-size rewrite within such a version's second looks the same: it is not settled
    until `SETTLE_S` later. Python 3.10 read the "Z" form as no time at all (settled)."""
    import datetime

    from zephon_torch.io._versions import SETTLE_S, _settled

    when = datetime.datetime(2026, 12, 6, 10, 0, 0, tzinfo=datetime.timezone.utc).timestamp()
    for version in ("2026-12-06T10:00:00Z", "2026-12-06T10:00:00+00:00"):
        assert not _settled(version, when + 1)
        assert _settled(version, when + SETTLE_S)
    assert _settled("2026-12-06T10:00:00.250Z", when + 1)  # a finer time tells rewrites apart
