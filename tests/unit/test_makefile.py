"""The Makefile's environments: each is set up again when what it builds changes, so no suite
runs against a compiled module older than its source (an editable install builds
``zephon_torch._native`` in the tree, one file per Python version)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ["pyproject.toml", "constraints.txt", "constraints-oldest.txt", "setup.py"]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
@pytest.mark.parametrize("stamp", [".venv/.installed", ".venv-oldest/.installed"])
def test_a_changed_extension_source_sets_the_environment_up_again(
    tmp_path: Path, stamp: str
) -> None:
    shutil.copy(ROOT / "Makefile", tmp_path)
    (tmp_path / "zephon_torch").mkdir()
    for name in [*SOURCES, "zephon_torch/_native.c"]:
        (tmp_path / name).write_text("")
        os.utime(tmp_path / name, (1_000, 1_000))
    (tmp_path / stamp).parent.mkdir()
    (tmp_path / stamp).write_text("")
    os.utime(tmp_path / stamp, (2_000, 2_000))

    def up_to_date() -> bool:  # `make -q`: exit 0 where nothing would run
        done = subprocess.run(["make", "-q", stamp], cwd=tmp_path, capture_output=True, check=False)
        return done.returncode == 0

    assert up_to_date()
    os.utime(tmp_path / "zephon_torch/_native.c", (3_000, 3_000))  # the C source edited
    assert not up_to_date()
