"""`.npy` headers read and mapped as numpy does, without `ast`: CPython 3.11's AST builder fails
when two threads parse at once, and other code (the traceback module, torch.compile) parses
too."""

from __future__ import annotations

import ast
import gc
import io
import re
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_torch.io import Dataset
from zephon_torch.io._mapped import map_array, read_header

_INTEGERS = [f"{order}{kind}{size}" for order in "<>" for kind in "iu" for size in (1, 2, 4, 8)]


def _numpy_header(data: bytes) -> tuple[tuple[int, ...], bool, np.dtype[Any], int]:
    handle = io.BytesIO(data)
    version = np.lib.format.read_magic(handle)
    if version == (1, 0):
        shape, fortran_order, dtype = np.lib.format.read_array_header_1_0(handle)
    else:  # 3.0 differs from 2.0 in the header's encoding only: utf-8, not latin-1
        shape, fortran_order, dtype = np.lib.format.read_array_header_2_0(handle)
    return shape, fortran_order, dtype, handle.tell()


@settings(max_examples=150, deadline=None)
@given(
    dtype=st.sampled_from([*_INTEGERS, "<f4", ">f8", "<c8", "|b1", "<U3", "<M8[ns]", "|V4"]),
    shape=st.lists(st.integers(0, 4), max_size=3),
    fortran=st.booleans(),
    version=st.sampled_from([(1, 0), (2, 0), (3, 0)]),
)
def test_a_header_reads_and_maps_as_numpy_reads_it(
    tmp_path_factory: pytest.TempPathFactory,
    dtype: str,
    shape: list[int],
    fortran: bool,
    version: tuple[int, int],
) -> None:
    described = np.dtype(dtype)
    array = np.zeros(shape, dtype=described)
    array = np.asfortranarray(array) if fortran else array
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, version=version)
    data = buffer.getvalue()

    handle = io.BytesIO(data)
    found = read_header(handle)
    assert (found.shape, found.fortran_order, found.dtype, handle.tell()) == _numpy_header(data)
    path = tmp_path_factory.mktemp("npy") / "a.npy"
    path.write_bytes(data)
    mapped = map_array(str(path))
    expected = np.load(path, mmap_mode="r", allow_pickle=False)
    assert type(mapped) is np.ndarray and mapped.dtype == expected.dtype
    assert mapped.shape == expected.shape and np.array_equal(mapped, expected)
    assert mapped.flags.f_contiguous == expected.flags.f_contiguous and not mapped.flags.writeable


def _file(text: str, version: tuple[int, int] = (1, 0)) -> bytes:
    """A `.npy` file's bytes with header `text` (padded as numpy pads) and 48 data bytes."""
    size = 2 if version == (1, 0) else 4
    header = text.encode("latin-1")
    header += b" " * (-(10 + size - 2 + len(header) + 1) % 64) + b"\n"
    length = len(header).to_bytes(size, "little")
    return b"\x93NUMPY" + bytes(version) + length + header + bytes(48)


@pytest.mark.filterwarnings("ignore:Reading `.npy`:UserWarning")  # numpy, on Python 2 longs
@pytest.mark.parametrize(
    "text",
    [
        "{'shape':(3,2),'fortran_order':False,'descr':'<i8'}",  # other writers: any order
        "{ 'descr' : '<u2' , 'fortran_order' : True , 'shape' : ( 4 , 6 ) , }",
        "{'descr': '<i4', 'fortran_order': False, 'shape': (3L, 4L), }",  # Python 2's longs
        "{'descr': '<i4', 'fortran_order': False, 'shape': (12,)}",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (), }",
    ],
)
def test_headers_other_writers_lay_out_read_as_numpy_reads_them(text: str) -> None:
    data = _file(text)
    handle = io.BytesIO(data)
    found = read_header(handle)
    assert (found.shape, found.fortran_order, found.dtype, handle.tell()) == _numpy_header(data)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "magic string"),
        (b"\x93NUMPY", "magic string"),
        (b"not a numpy file at all", "magic string"),
        (b"\x93NUMPY\x01\x00\x40\x00{'descr': '<i4'", "cut short: 15 of 64 bytes"),
        (b"\x93NUMPY\x02\x00\xff\xff\xff\x00{", "over 10,000 bytes"),
        (b"\x93NUMPY\x04\x00", "unknown .npy format version 4.0"),
        (_file("{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (2,), }"), "structured"),
        (_file("{'descr': '<i4', 'fortran_order': False, }"), "does not read"),
        (_file("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), 'x': 1}"), "does not read"),
        (_file("{'descr': '<i4', 'descr': '<i4', 'shape': (2,), }"), "does not read"),
        (_file("{'descr': '<i4', 'fortran_order': False, 'shape': (2), }"), "does not read"),
        (_file("{'descr': '<i4', 'fortran_order': 0, 'shape': (2,), }"), "does not read"),
        (_file("['descr', '<i4']"), "does not read"),
        (
            _file("{'descr': '<q9', 'fortran_order': False, 'shape': (2,), }"),
            "is not a numpy dtype",
        ),
        # a bare OverflowError where the file was mapped (its size, 0, matched the header's)
        (
            _file(f"{{'descr': '<i4', 'fortran_order': False, 'shape': ({2**63}, 0), }}"),
            f"has a dimension past {2**63 - 1}",
        ),
    ],
)
def test_bytes_that_are_no_header_it_reads_are_a_value_error(data: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        read_header(io.BytesIO(data))


def test_an_array_of_python_objects_is_not_mapped(tmp_path: Path) -> None:
    np.save(tmp_path / "o.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="Python objects"):
        map_array(str(tmp_path / "o.npy"))


class _Collected:
    """Garbage whose finalizer runs Python code: a collection inside the AST builder switches
    threads there, which is what lets two parses meet."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        self.freed = [0] * 3


@pytest.fixture
def fast_thread_switches() -> Iterator[None]:
    interval, thresholds = sys.getswitchinterval(), gc.get_threshold()
    sys.setswitchinterval(1e-6)
    gc.set_threshold(50)
    yield
    sys.setswitchinterval(interval)
    gc.set_threshold(*thresholds)


def _run_against(
    other: Callable[[], None], read: Callable[[], None], done: threading.Event
) -> None:
    """Three threads run `read` while one runs `other` until they are done."""
    interloper = threading.Thread(target=other)
    readers = [threading.Thread(target=read) for _ in range(3)]
    interloper.start()
    for reader in readers:
        reader.start()
    for reader in readers:
        reader.join()
    done.set()
    interloper.join()


@pytest.mark.usefixtures("fast_thread_switches")
def test_threads_open_npy_shards_while_another_thread_parses_python(tmp_path: Path) -> None:
    for shard in range(30):
        np.save(tmp_path / f"{shard:02}.npy", np.full((3, 4), shard, dtype=np.int32))
    literal = "{" + ", ".join(f"'k{i}': (((((1,),),),),)" for i in range(20)) + "}"
    errors: list[BaseException] = []
    done = threading.Event()

    def parse() -> None:
        try:
            while not done.is_set():
                _Collected()
                ast.literal_eval(literal)
        except BaseException as error:
            errors.append(error)

    def open_and_read() -> None:
        try:
            for _ in range(15):
                _Collected()
                dataset = Dataset.from_path("n", tmp_path)
                assert [r["input_ids"][0] for r in dataset.read_rows(7, [0])] == [7]
        except BaseException as error:
            errors.append(error)

    _run_against(parse, open_and_read, done)
    assert errors == []


def _fail() -> int:
    numbers = [1]
    return numbers[0] + numbers[1] * numbers[2]


@pytest.mark.usefixtures("fast_thread_switches")
def test_headers_of_any_dtype_read_while_another_thread_formats_tracebacks(tmp_path: Path) -> None:
    """The traceback module parses source lines with `ast` (3.11 places its carets so): no lock
    of ours would keep it out, so no header is parsed with `ast`."""
    paths = []
    for number, dtype in enumerate(["<f4", "<U3", ">i2", "|b1"]):
        np.save(tmp_path / f"{number}.npy", np.zeros((3, 2), dtype=dtype))
        paths.append(tmp_path / f"{number}.npy")
    foreign = tmp_path / "foreign.npy"
    foreign.write_bytes(_file("{'shape':(3,2),'fortran_order':False,'descr':'<i8'}"))
    paths.append(foreign)
    expected = [np.load(path, mmap_mode="r") for path in paths]
    errors: list[BaseException] = []
    done = threading.Event()

    def format_tracebacks() -> None:
        try:
            while not done.is_set():
                _Collected()
                try:
                    _fail()
                except IndexError as error:
                    "".join(traceback.format_exception(error))
        except BaseException as error:
            errors.append(error)

    def read() -> None:
        try:
            for _ in range(60):
                for path, want in zip(paths, expected, strict=True):
                    _Collected()
                    mapped = map_array(str(path))
                    assert (mapped.dtype, mapped.shape) == (want.dtype, want.shape)
        except BaseException as error:
            errors.append(error)

    _run_against(format_tracebacks, read, done)
    assert errors == []
