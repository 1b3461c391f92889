"""A batch's copy (``ops._copy.fill``): the compiled one gives exactly numpy's int64 cast of
every stored integer type, byte order and stride, and says whether an id exceeds the bound
exactly when one does; bad arguments are refused, not copied past the buffer."""

from __future__ import annotations

import array
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon_torch.ops import _copy
from zephon_torch.ops._copy import NO_CHECK, fill

INTEGERS = ["i1", "u1", "i2", "u2", "i4", "u4", "i8", "u8"]


def compiled() -> Any:
    """The compiled module: `make install` builds it, so its absence is a failure here."""
    from zephon_torch import _native

    return _native


@st.composite
def stored_part(draw: st.DrawFn) -> np.ndarray[Any, Any]:
    """A 1-D integer array as a reader may hand one over: any width and signedness, either
    byte order, contiguous or a strided (possibly reversed) view."""
    code = draw(st.sampled_from(INTEGERS))
    order = draw(st.sampled_from(["=", "<", ">"]))
    dtype = np.dtype(order + code)
    info = np.iinfo(dtype)
    values = draw(st.lists(st.integers(int(info.min), int(info.max)), max_size=40))
    step = draw(st.sampled_from([1, 1, 2, 3, -1, -2]))
    base = np.zeros(max(1, len(values) * abs(step)), dtype=dtype)
    view = base[:: abs(step)][: len(values)] if values else base[:0]
    view[:] = values
    return view if step > 0 else view[::-1]


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(stored_part(), max_size=6),
    top=st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 2**31 - 1, 65535, NO_CHECK])),
)
def test_the_compiled_copy_is_numpy_s_cast_and_finds_every_id_above_the_bound(
    parts: list[np.ndarray[Any, Any]], top: int
) -> None:
    expected = np.empty(sum(p.size for p in parts), dtype=np.int64)
    np.concatenate([*parts, np.zeros(0, np.int64)], out=expected)  # what batches were copied by
    over = bool(expected.size) and int(expected.view(np.uint64).max()) > top
    out = np.full(expected.size, -7, dtype=np.int64)
    native = all(p.dtype.isnative for p in parts)
    if native:
        assert compiled().fill(parts, out, top) is over
        assert out.tolist() == expected.tolist()
    else:  # byte-swapped values are numpy's to cast
        with pytest.raises(TypeError, match="does not hold native integers"):
            compiled().fill(parts, out, top)
    out[:] = -7
    # through the wrapper: the compiled copy where it can, numpy's otherwise, same ids
    said = fill(parts, out, top)
    assert out.tolist() == expected.tolist()
    assert said is (over if native else top != NO_CHECK)


def test_numpy_s_copy_gives_the_same_ids_and_leaves_the_check_to_the_caller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_copy, "_native", None)
    parts = [np.array([1, 2], np.uint16), np.array([-1], np.int8), np.arange(3, dtype=">i4")]
    out = np.empty(6, dtype=np.int64)
    assert fill(parts, out, 10) is True  # not looked at: the caller's IdCheck reads them
    assert out.tolist() == [1, 2, -1, 0, 1, 2]
    assert fill(parts, out, NO_CHECK) is False


@pytest.mark.parametrize("native", [True, False])
def test_a_batch_s_two_dimensional_buffer_is_filled_row_after_row(
    native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches are copied straight into their [B, S] buffer: rows one after another, as into
    its flat view, by either copy."""
    if not native:
        monkeypatch.setattr(_copy, "_native", None)
    parts = [np.arange(5, dtype=np.int32), np.array([9, 8, 7], np.uint16)]
    out = np.full((2, 4), -1, dtype=np.int64)
    assert fill(parts, out, 8) is True
    assert out.tolist() == [[0, 1, 2, 3], [4, 9, 8, 7]]
    with pytest.raises(ValueError, match="contiguous int64"):  # a column of a wider buffer
        compiled().fill(parts, np.empty((8, 2), np.int64).T[:, :4], 8)


def test_the_compiled_copy_is_built_and_used() -> None:
    """`make install` builds the module; without it every batch is copied by numpy."""
    assert compiled().fill([np.array([3], np.int32)], np.empty(1, np.int64), 2) is True
    assert _copy._native is not None


@pytest.mark.parametrize(
    ("parts", "out", "error", "message"),
    [
        ([np.arange(3)], np.empty(2, np.int64), ValueError, "longer than `out`"),
        ([np.arange(3)], np.empty(4, np.int64), ValueError, "shorter than `out`"),
        ([np.arange(4).reshape(2, 2)], np.empty(4, np.int64), ValueError, "not 1-D"),
        ([np.arange(2)], np.empty(4, np.int64)[::2], ValueError, "contiguous int64"),
        ([np.arange(2)], np.empty(2, np.int32), ValueError, "contiguous int64"),
        ([np.arange(2)], np.empty(2, np.uint64), ValueError, "contiguous int64"),
        ([np.arange(2.0)], np.empty(2, np.int64), TypeError, "part 0 does not hold native"),
        ([np.arange(2, dtype=bool)], np.empty(2, np.int64), TypeError, "does not hold"),
        (np.arange(2), np.empty(2, np.int64), ValueError, "part 0 is not 1-D"),
        (7, np.empty(2, np.int64), TypeError, "must be a sequence"),
        # spans (base, first, stop): within their base, of a 1-D integer base, as three items
        ([(np.arange(3), -1, 2)], np.empty(3, np.int64), ValueError, "part 0 is a span outside"),
        ([(np.arange(3), 2, 1)], np.empty(1, np.int64), ValueError, "a span outside its base"),
        ([(np.arange(3), 0, 4)], np.empty(4, np.int64), ValueError, "a span outside its base"),
        ([(np.arange(3), 0, 3)], np.empty(2, np.int64), ValueError, "longer than `out`"),
        ([(np.arange(3), 0)], np.empty(3, np.int64), ValueError, "not \\(base, first, stop\\)"),
        ([(np.arange(3), "0", 3)], np.empty(3, np.int64), TypeError, ""),
        ([(np.arange(3), -1, "3")], np.empty(3, np.int64), TypeError, ""),  # both converted
        ([(np.arange(4).reshape(2, 2), 0, 1)], np.empty(1, np.int64), ValueError, "not 1-D"),
        ([(np.arange(2.0), 0, 2)], np.empty(2, np.int64), TypeError, "does not hold native"),
        ([(np.arange(3), 0, 3), (object(), 0, 1)], np.empty(4, np.int64), TypeError, ""),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_written_past_the_buffer(
    parts: Any, out: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        compiled().fill(parts, out, 0)


@pytest.mark.skipif(sys.version_info < (3, 12), reason="Python classes export buffers from 3.12")
def test_a_part_that_empties_the_list_as_its_buffer_is_taken_leaves_nothing_read_freed() -> None:
    """A part's ``__buffer__`` runs Python code: the list of parts it changes is read afresh
    (an item held from before would be freed, and read after)."""
    parts: list[Any] = []

    class Emptying:
        def __buffer__(self, flags: int) -> memoryview:
            parts.clear()  # the rest of the list, and the list's own array, freed
            [array.array("q", [9] * 4) for _ in range(1000)]  # and their memory reused
            return memoryview(array.array("q", [1, 2]))

    parts += [Emptying(), array.array("i", [3, 4])]
    out = array.array("q", [0] * 4)
    with pytest.raises(ValueError, match="shorter than `out`"):
        compiled().fill(parts, out, NO_CHECK)
    assert out.tolist() == [1, 2, 0, 0]
    # the base of a span (held by its tuple alone), its buffer kept while the call runs
    parts += [(Emptying(), 0, 2), (array.array("i", [3, 4]), 0, 2)]
    out = array.array("q", [0] * 4)
    with pytest.raises(ValueError, match="shorter than `out`"):
        compiled().fill(parts, out, NO_CHECK)
    assert out.tolist() == [1, 2, 0, 0]


UNALIGNED = """
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import _native
raw = np.arange(4096, dtype=np.uint8)
for code in ["i2", "u2", "i4", "u4", "i8", "u8"]:
    for offset in range(1, np.dtype(code).itemsize):
        ids = np.frombuffer(raw, code, count=200, offset=offset)  # as an MDS sample's array
        parts = [ids, ids[::3], ids[::-1]]
        out = np.empty(sum(map(len, parts)), np.int64)
        _native.fill(parts, out, 0)
        assert out.tolist() == np.concatenate(parts).astype(np.int64).tolist(), code
"""


def sanitized(tmp_path: Path, script: str, level: str) -> subprocess.CompletedProcess[str]:
    """``script`` run against the module built with the undefined behaviour sanitizer at
    optimisation ``level`` (its folder as ``sys.argv[1]``); skips without one."""
    cc = shlex.split(sysconfig.get_config_var("CC") or "cc")
    runtime = ""
    if shutil.which(cc[0]):
        ask = [*cc, "-print-file-name=libubsan.so"]
        runtime = subprocess.run(ask, capture_output=True, text=True, check=False).stdout.strip()
    if not os.path.isabs(runtime):  # a bare name: the compiler has no sanitizer runtime
        pytest.skip("needs a C compiler with the undefined behaviour sanitizer")
    source = Path(_copy.__file__).parents[1] / "_native.c"
    module = tmp_path / f"_native{sysconfig.get_config_var('EXT_SUFFIX')}"
    flags = [level, "-fPIC", "-shared", "-fsanitize=undefined", "-fno-sanitize-recover=all"]
    include = f"-I{sysconfig.get_path('include')}"
    subprocess.run([*cc, *flags, include, str(source), "-o", str(module)], check=True)
    env = {**os.environ, "LD_PRELOAD": runtime}
    run = [sys.executable, "-c", script, str(tmp_path)]
    return subprocess.run(run, env=env, capture_output=True, text=True, check=False)


def test_ids_at_any_address_are_read_without_undefined_behaviour(tmp_path: Path) -> None:
    """An MDS sample's array lies wherever the sample's bytes put it: its ids are read as
    bytes, where a load of a misaligned pointer is undefined (the sanitizer aborts on one)."""
    done = sanitized(tmp_path, UNALIGNED, "-O3")
    assert done.returncode == 0, done.stderr[-2000:]


SPANS_OUTSIDE = """
import array
import sys
sys.path.insert(0, sys.argv[1])
import _native
ends = [-(2**63), -1, 0, 1, 2**63 - 1]
for base in (array.array("q", [1, 2, 3]), array.array("d", [1.0])):
    for first in ends:
        for stop in ends:
            if 0 <= first <= stop <= len(base) and base.typecode == "q":
                continue
            try:
                _native.fill([(base, first, stop)], array.array("q", [0] * 3), 0)
            except (TypeError, ValueError):
                pass
            else:
                raise AssertionError((first, stop))
"""


def test_a_span_outside_its_base_is_refused_without_undefined_behaviour(tmp_path: Path) -> None:
    """A span's first and stop may be any 64-bit ints: refused, their difference (which may
    not fit) never taken. Unoptimised, where the sanitizer sees every subtraction made."""
    done = sanitized(tmp_path, SPANS_OUTSIDE, "-O0")
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_read_only_output_is_refused() -> None:
    out = np.empty(2, np.int64)
    out.flags.writeable = False
    with pytest.raises((BufferError, ValueError)):
        compiled().fill([np.arange(2)], out, 0)


@pytest.mark.parametrize(("setting", "native"), [(None, True), ("0", True), ("1", False)])
def test_zephon_torch_no_native_takes_numpy_s_loops(setting: str | None, native: bool) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ZEPHON_TORCH_NO_NATIVE"}
    if setting is not None:
        env["ZEPHON_TORCH_NO_NATIVE"] = setting
    code = (
        "from zephon_torch._compiled import NATIVE\n"
        "from zephon_torch.ops import _copy\n"
        "from zephon_torch.work import _permutation\n"
        "print(NATIVE, _copy._native is not None, _permutation._native is not None)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == [str(native)] * 3


@pytest.mark.parametrize(("top", "error"), [(-1, OverflowError), (2**64, OverflowError)])
def test_a_bound_outside_64_bits_is_refused_not_wrapped(top: Any, error: type) -> None:
    """Parsed as C's unsigned long long, -1 read as no bound and 2**64 as 0."""
    with pytest.raises(error):
        compiled().fill([np.arange(2)], np.empty(2, np.int64), top)
    with pytest.raises(TypeError):
        compiled().fill([np.arange(2)], np.empty(2, np.int64), 1.5)
