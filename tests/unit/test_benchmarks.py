"""The benchmark scripts' command lines do what their help and `benchmarks/README.md` say (no
timing here: the scripts print their own ratios)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` imported as a module (its folder on the path, as when run)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    sys.path.insert(0, str(BENCHMARKS))
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    finally:
        sys.path.remove(str(BENCHMARKS))
    return module


def test_packing_quick_sets_only_the_settings_not_given() -> None:
    """`--quick --repeats 3` ran one repeat: --quick overwrote the repeats and passes given
    beside it (but not --max-code-docs)."""
    packing = benchmark("packing")
    quick = packing.parse_args(["--quick"])
    assert (quick.repeats, quick.prose_passes, quick.paras_passes) == (1, 5, 2)
    assert quick.max_code_docs == 300
    given = packing.parse_args(
        ["--quick", "--repeats", "3", "--prose-passes", "7", "--paras-passes", "4"]
    )
    assert (given.repeats, given.prose_passes, given.paras_passes) == (3, 7, 4)
    assert packing.parse_args(["--quick", "--max-code-docs", "50"]).max_code_docs == 50
    full = packing.parse_args([])
    assert (full.repeats, full.prose_passes, full.paras_passes, full.max_code_docs) == (
        3,
        30,
        10,
        None,
    )


def test_pretokenized_keep_refuses_formats_written_with_other_settings(tmp_path: Path) -> None:
    """`--keep DIR --dtype uint16 --doc-tokens 480` after a default run measured the int32,
    uncut files already in DIR while printing "uint16 ids stored" and 480-token documents (the
    same token count, so no mismatch showed)."""
    pretokenized = benchmark("pretokenized")
    first = argparse.Namespace(copies=1, doc_tokens=0, dtype="int32")
    pretokenized.kept_settings(tmp_path, first, write=False)  # an empty folder: nothing kept
    (tmp_path / "npy").mkdir()
    with pytest.raises(SystemExit, match=r"no settings\.json"):
        pretokenized.kept_settings(tmp_path, first, write=False)
    pretokenized.kept_settings(tmp_path, first, write=True)
    pretokenized.kept_settings(tmp_path, first, write=False)  # the same settings: reused
    other = argparse.Namespace(copies=1, doc_tokens=480, dtype="uint16")
    with pytest.raises(SystemExit, match=r"--doc-tokens 0 \(asked 480\), --dtype int32"):
        pretokenized.kept_settings(tmp_path, other, write=False)


def test_remote_control_downloads_every_object_once_told_to(tmp_path: Path) -> None:
    """The control side of `remote.py` (the local pass beside a download) measures what the
    transfer costs only if its other process downloads the prefix's objects, all of them, and
    only after `go()`: started early, it would cost the pass nothing it measures."""
    from zephon_torch._moto import moto_server, upload

    remote = benchmark("remote")
    data = tmp_path / "data"
    data.mkdir()
    for k in range(3):
        (data / f"part-{k}.bin").write_bytes(bytes([k]) * (1000 + k))
    with moto_server() as (endpoint, _):
        upload(endpoint, data, "bench", "x")
        beside = remote.DownloadBeside(endpoint, "s3://bench/x/", tmp_path / "beside")
        assert list((tmp_path / "beside").iterdir()) == []  # listed, not yet downloading
        beside.go()
        seconds, cpu = beside.finish()
    assert seconds > 0 and cpu > 0
    got = {p.name: p.read_bytes() for p in (tmp_path / "beside").iterdir()}
    assert got == {p.name: p.read_bytes() for p in data.iterdir()}
