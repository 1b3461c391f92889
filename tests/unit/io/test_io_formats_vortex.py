"""Vortex files written by vortex-data: detection, random access, projection, errors."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tests.unit.io.test_io_formats_writers import assert_threads_read_like_one, write_vortex
from zephon_torch.errors import DataError
from zephon_torch.io import Dataset

COUNTS = (300, 50)


def table(count: int, start: int = 0) -> pa.Table:
    ids = range(start, start + count)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "text": [f"vortex row {i} é" + "!" * (i % 4) for i in ids],
            "ids": pa.array([list(range(i, i + i % 6)) for i in ids], pa.list_(pa.int32())),
        }
    )


@pytest.fixture(scope="module")
def vortex_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("vortex")
    write_vortex(root / "a.vortex", table(COUNTS[0]))
    write_vortex(root / "b.vortex", table(COUNTS[1], start=COUNTS[0]))
    return root


def test_vortex_files_are_detected_and_rows_come_in_the_order_asked(vortex_dir: Path) -> None:
    dataset = Dataset.from_path("v", vortex_dir)
    assert dataset.format == "vortex"
    assert [shard.num_rows for shard in dataset.shards] == list(COUNTS)
    expected = table(COUNTS[0]).to_pylist()
    order = [299, 0, 17, 17, 150]
    assert dataset.read_rows(0, order) == [expected[i] for i in order]
    assert dataset.read_rows(1, range(50)) == table(50, start=300).to_pylist()
    assert dataset.read_rows(1, []) == []


def test_format_vortex_reads_a_file_whatever_its_name(vortex_dir: Path, tmp_path: Path) -> None:
    odd = tmp_path / "data.bin"
    odd.write_bytes((vortex_dir / "b.vortex").read_bytes())
    dataset = Dataset.from_path("v", odd, format="vortex")
    assert dataset.read_rows(0, [0])[0]["id"] == 300


def test_without_vortex_data_opening_a_vortex_file_names_the_extra_and_its_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vortex-data is built for Python 3.11 and newer only, so on 3.10 pip cannot install
    `[vortex]`: the hint names that, where it named the extra alone."""
    monkeypatch.setitem(sys.modules, "vortex", None)  # as where vortex-data is not installed
    (tmp_path / "a.vortex").write_bytes(b"not read")
    with pytest.raises(ImportError, match=r"zephon-torch\[vortex\]'.*Python 3\.11 or newer"):
        Dataset.from_path("v", tmp_path)


def test_a_projection_reads_only_the_requested_columns(vortex_dir: Path) -> None:
    dataset = Dataset.from_path("v", vortex_dir, columns=["ids", "id"], token_columns=["ids"])
    [row] = dataset.read_rows(0, [9])
    assert list(row) == ["ids", "id"]
    assert row["ids"].dtype == np.int32 and row["ids"].tolist() == [9, 10, 11]
    with pytest.raises(DataError, match=r"has no column 'nope'"):
        Dataset.from_path("v", vortex_dir, columns=["nope"])
    with pytest.raises(DataError, match=r"token column 'text' holds string"):
        Dataset.from_path("v", vortex_dir, token_columns=["text"])


@pytest.mark.parametrize("damage", ["truncated", "garbage", "nul in a name"])
def test_a_damaged_file_raises_a_data_error_naming_dataset_and_shard(
    vortex_dir: Path, tmp_path: Path, damage: str
) -> None:
    path = tmp_path / "x.vortex"
    data = (vortex_dir / "a.vortex").read_bytes()
    if damage == "nul in a name":  # pyarrow's ArrowException from the schema, not a ValueError
        at = data.index(b"text")
        data = data[: at + 2] + b"\0" + data[at + 3 :]
    path.write_bytes({"truncated": data[: len(data) // 2], "garbage": b"garbage"}.get(damage, data))
    with pytest.raises(DataError, match=r"not a readable Vortex file") as caught:
        Dataset.from_path("broken", path)
    assert (caught.value.dataset, caught.value.shard) == ("broken", str(path))


def test_eight_threads_reading_at_random_see_what_one_thread_sees(vortex_dir: Path) -> None:
    assert_threads_read_like_one(lambda: Dataset.from_path("v", vortex_dir, token_columns=["ids"]))


def test_a_pickled_dataset_travels_without_open_files_and_reads_the_same(
    vortex_dir: Path,
) -> None:
    dataset = Dataset.from_path("v", vortex_dir, columns=["text"])
    before = dataset.read_rows(0, [4, 2])
    payload = pickle.dumps(dataset)
    assert len(payload) < 2048
    assert before == [{"text": "vortex row 4 é"}, {"text": "vortex row 2 é!!"}]
    assert pickle.loads(payload).read_rows(0, [4, 2]) == before


def test_a_panic_of_vortex_on_damaged_bytes_is_a_data_error(tmp_path: Path) -> None:
    """vortex's Rust code panics on some damaged dtype bytes; pyo3 raises that as a
    PanicException, a BaseException that went past every handler to the user."""
    rows = [
        {"text": f"doc {i} " + "w" * (i % 13), "id": i, "toks": list(range(i % 6))}
        | {"meta": {"a": i, "b": None if i % 2 else "x"}}
        for i in range(200)
    ]
    source = tmp_path / "a.vortex"
    write_vortex(source, pa.Table.from_pylist(rows))
    data = source.read_bytes()
    refused = 0
    for at in (5036, 5043, 5060):  # in the footer's dtype (vortex-data 0.93 panics there)
        damaged = bytearray(data)
        damaged[at] ^= 0x5A
        path = tmp_path / f"damaged-{at}.vortex"
        path.write_bytes(bytes(damaged))
        try:
            Dataset.from_path("vx", path).read_rows(0, range(200))
        except DataError as error:
            assert (error.dataset, error.shard) == ("vx", str(path))
            refused += 1
    assert refused


def _decodes_past_its_buffers(path: Path) -> bool:
    """Whether vortex decodes ``path`` to a table whose offsets reach past its buffers (what
    reading its values would segfault on), asked without reading them."""
    vortex = pytest.importorskip("vortex")  # vortex-data: Python 3.11+

    try:
        got = vortex.open(str(path)).to_arrow().read_all()
    except BaseException:  # refused by vortex itself (a PanicException is a BaseException)
        return False
    try:
        got.validate(full=True)
    except pa.ArrowInvalid:
        return True
    return False


def test_bytes_that_decode_to_offsets_past_their_buffers_are_a_data_error(tmp_path: Path) -> None:
    """Runs of random bytes written over a file: some decode, in vortex-data 0.93, to list
    or string offsets past their buffers (or to text that is not UTF-8), which pyarrow read
    through when their rows were made: rows of garbage without an error, or a segfault of the
    whole run (3 damaged files in 80)."""
    rows = [
        {"text": f"doc {i} " + "w" * (i % 13), "id": i, "toks": list(range(i % 6))}
        for i in range(200)
    ]
    source = tmp_path / "a.vortex"
    write_vortex(source, pa.Table.from_pylist(rows))
    data = source.read_bytes()
    rng = np.random.default_rng(1)
    found = 0
    for attempt in range(400):
        at, size = int(rng.integers(len(data))), int(rng.integers(1, 300))
        damaged = bytearray(data)
        damaged[at : at + size] = rng.integers(
            256, size=len(damaged[at : at + size]), dtype=np.uint8
        ).tobytes()
        path = tmp_path / f"damaged-{attempt}.vortex"
        path.write_bytes(bytes(damaged))
        if not _decodes_past_its_buffers(path):
            continue
        found += 1
        with pytest.raises(
            DataError, match=r"cannot read rows 0\.\.199: Column \d: In chunk 0: Invalid"
        ) as caught:
            Dataset.from_path("vx", path).read_rows(0, range(200))
        assert (caught.value.dataset, caught.value.shard) == ("vx", str(path))
        if found == 3:
            break
    assert found


def test_a_null_token_id_names_its_row(tmp_path: Path) -> None:
    ids = pa.array([[1, 2], [3], [4, None], [None], [5]], pa.list_(pa.int32()))
    path = tmp_path / "n.vortex"
    write_vortex(path, pa.table({"ids": ids}))
    dataset = Dataset.from_path("v", path, token_columns=["ids"])
    assert [row["ids"].tolist() for row in dataset.read_rows(0, [4, 0])] == [[5], [1, 2]]
    with pytest.raises(DataError, match=r"holds a null token id in row 3") as caught:
        dataset.read_rows(0, [4, 3, 2, 0])  # the first asked for of the two
    assert (caught.value.dataset, caught.value.shard, caught.value.row) == ("v", str(path), 3)


def test_a_flipped_bit_in_stored_ids_can_read_as_other_ids(tmp_path: Path) -> None:
    """Vortex files carry no checksum (README, Formats: damage that reads as other data): a
    one-bit flip was found to change a row's token ids with no error, as in `.npy` and LitData;
    a fuzz run's damage found it where the README listed Vortex nowhere."""
    rng = np.random.default_rng(0)
    ids = [rng.integers(0, 1000, size=int(n)).tolist() for n in rng.integers(50, 400, size=20)]
    folder = tmp_path / "v"
    path = write_vortex(
        folder / "ids.vortex", pa.table({"ids": pa.array(ids, pa.list_(pa.int32()))})
    )
    good = path.read_bytes()

    def read() -> list[list[int]]:
        dataset = Dataset.from_path("v", folder, token_columns=["ids"])
        return [row["ids"].tolist() for row in dataset.read_rows(0, range(len(ids)))]

    assert read() == ids
    silent = None
    for at in range(64, len(good) // 2):
        damaged = bytearray(good)
        damaged[at] ^= 0x01
        path.write_bytes(bytes(damaged))
        try:
            if read() != ids:
                silent = at
                break
        except DataError:
            continue
    assert silent is not None


def test_a_null_row_of_a_nullable_top_level_struct_is_a_data_error_naming_it(
    tmp_path: Path,
) -> None:
    """vortex-data writes a struct array holding nulls as a file of nullable rows; its
    `to_arrow` of a read that met one aborted the whole process (a Rust assertion that cannot
    unwind), where a JSON Lines `null` line is a bad row."""
    vortex = pytest.importorskip("vortex")  # vortex-data: Python 3.11+

    kind = pa.struct([("text", pa.string()), ("n", pa.int64())])
    rows = [None if i % 4 == 3 else {"text": f"doc {i} é", "n": i} for i in range(12)]
    path = tmp_path / "nullable.vortex"
    vortex.io.write(vortex.array(pa.array(rows, kind)), str(path))
    for columns in (None, ["text"]):
        dataset = Dataset.from_path("v", path, columns=columns)
        assert dataset.shards[0].num_rows == 12
        fields = columns or ["text", "n"]
        expected = [{k: rows[i][k] for k in fields} for i in (10, 0, 10, 5)]  # type: ignore[index]
        assert dataset.read_rows(0, [10, 0, 10, 5]) == expected
        with pytest.raises(DataError, match=r"holds a null, not a struct of fields, in row 7"):
            dataset.read_rows(0, [8, 7, 3, 0])  # the first null asked for
        with pytest.raises(DataError) as caught:
            dataset.read_rows(0, range(12))
        assert (caught.value.dataset, caught.value.shard, caught.value.row) == ("v", str(path), 3)
