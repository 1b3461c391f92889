"""verify --plot: a PNG drawn without a display, whose series are the runs' hashes."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_verify import SHRINKING, write_recipe
from zephon_torch._plot import fingerprint_value, plot_world_sizes, render
from zephon_torch.cli import main
from zephon_torch.verify import Run, compare, load_recipe, standard_run, zephon_run

pytest.importorskip("matplotlib")

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_the_default_world_sizes_are_16_then_8_32_64_or_the_divisors_there_are() -> None:
    assert plot_world_sizes(64) == (16, [8, 32, 64], None)
    reference, others, note = plot_world_sizes(8)
    assert reference == 8 and others == [1, 2, 4] and note is not None and "16" in note


def test_the_plot_renders_a_png_whose_series_are_the_hashes_of_the_runs(
    tmp_path: Path, tokenizer: Any
) -> None:
    build = load_recipe(write_recipe(tmp_path, tokenizer, "recipe"))
    comparison = compare(build, steps=6, fault_step=3, world_sizes=[2, 1, 4], train=True)
    out = tmp_path / "verify.png"
    series = render(comparison, out)
    width, height = png_size(out)
    assert width > 600 and height > 600  # two rows of panels

    names = [r.name for r in comparison.runs]
    assert names == [
        "zephon W=2",
        "zephon W=2 fault@3 -> W=1",
        "zephon W=2 fault@3 -> W=4",
        "standard W=2",
        "standard W=1",
        "standard W=4",
    ]
    fingerprints = series["fingerprints"]
    for run in comparison.runs:
        assert fingerprints[run.name] == [fingerprint_value(h) for h in run.hashes]
    # The runs are the ones `verify` prints: recomputed independently here.
    reference = zephon_run(build, 2, 6)
    assert fingerprints["zephon W=2"] == [fingerprint_value(h) for h in reference]
    assert fingerprints["zephon W=2 fault@3 -> W=4"] == fingerprints["zephon W=2"]
    assert fingerprints["standard W=4"] == [fingerprint_value(h) for h in standard_run(build, 4, 6)]
    assert fingerprints["standard W=4"] != fingerprints["standard W=2"]
    # Identical batches train bit-identical loss curves; the standard loader's do not.
    losses = series["losses"]
    assert len(losses["zephon W=2"]) == 6
    assert losses["zephon W=2 fault@3 -> W=1"] == losses["zephon W=2"]
    assert losses["standard W=1"] != losses["standard W=2"]


def test_the_command_writes_the_picture_and_prints_the_table(
    tmp_path: Path, tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    recipe = write_recipe(tmp_path, tokenizer, "recipe")
    out = tmp_path / "cli.png"
    code = main(["verify", str(recipe), "--plot", str(out), "--steps", "4", "--world-sizes", "4,2"])
    text = capsys.readouterr().out
    assert code == 0 and png_size(out)[0] > 0
    assert "zephon W=4 fault@2 -> W=2: IDENTICAL" in text and f"picture: {out}" in text


def test_a_picture_that_cannot_be_drawn_is_refused_before_any_run(
    tmp_path: Path,
    tokenizer: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The folder and matplotlib were checked only after every run: the runs were lost, with a
    traceback and exit code 1, the code of DIVERGES."""
    recipe = write_recipe(tmp_path, tokenizer, "recipe")
    base = ["verify", str(recipe), "--steps", "4", "--world-sizes", "4,2"]
    assert main([*base, "--plot", str(tmp_path / "missing" / "p.png")]) == 2
    captured = capsys.readouterr()
    assert "IDENTICAL" not in captured.out and "does not exist" in captured.err
    # a folder as the target, and a name other than .png (it got PNG bytes), were refused
    # only after the runs, or not at all
    (tmp_path / "folder.png").mkdir()
    for target, says in [("folder.png", "is a folder"), ("p.svg", "name it *.png")]:
        assert main([*base, "--plot", str(tmp_path / target)]) == 2
        captured = capsys.readouterr()
        assert "IDENTICAL" not in captured.out and says in captured.err
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as where it is not installed
    assert main([*base, "--plot", str(tmp_path / "p.png")]) == 2
    captured = capsys.readouterr()
    assert "IDENTICAL" not in captured.out and "pip install" in captured.err


def test_a_picture_that_fails_to_write_after_the_runs_keeps_the_verdict(
    tmp_path: Path,
    tokenizer: Any,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import zephon_torch._plot

    recipe = write_recipe(tmp_path, tokenizer, "recipe")
    taken = tmp_path / "p.png"
    taken.mkdir()  # a folder where the picture goes: writing it fails after the runs
    # (past the check before the runs, as a folder made while they ran would be)
    monkeypatch.setattr(zephon_torch._plot, "check_target", lambda path: None)
    code = main(
        ["verify", str(recipe), "--plot", str(taken), "--steps", "4", "--world-sizes", "4,2"]
    )
    captured = capsys.readouterr()
    assert code == 2 and "verdict: zephon_torch IDENTICAL" in captured.out
    assert "cannot write the picture" in captured.err


def test_importing_the_library_and_verify_does_not_import_matplotlib() -> None:
    code = (
        "import sys, zephon_torch, zephon_torch.verify, zephon_torch._plot, zephon_torch.cli; "
        "sys.exit('matplotlib' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_a_fault_step_of_0_compares_the_world_sizes_from_the_start_without_a_fault(
    tmp_path: Path, tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The help says "0: no fault", yet --plot refused 0; and --steps 1 failed on the default
    fault step (half the steps: 0) that the user never set."""
    recipe = write_recipe(tmp_path, tokenizer, "recipe")
    base = ["verify", str(recipe), "--world-sizes", "2,1"]
    for extra in (["--steps", "3", "--fault-step", "0"], ["--steps", "1"]):
        out = tmp_path / "nofault.png"
        assert main([*base, "--plot", str(out), *extra]) == 0
        text = capsys.readouterr().out
        assert "zephon W=1: IDENTICAL to zephon W=2" in text and "fault@" not in text
        assert png_size(out)[0] > 0
    late = ["--plot", str(tmp_path / "late.png"), "--steps", "3", "--fault-step", "3"]
    assert main([*base, *late]) == 2
    assert "`fault_step` must be in [0, steps=3) (0: no fault), got 3" in capsys.readouterr().err


def test_the_zephon_panel_s_title_follows_the_verdict() -> None:
    """It read "zephon_torch: curves coincide" whatever the verdict, DIVERGES included."""
    from zephon_torch._plot import panel_titles

    same, other = ["a" * 64, "b" * 64], ["a" * 64, "c" * 64]
    standard = [Run("standard W=2", same, zephon=False), Run("standard W=1", other, zephon=False)]
    identical = [Run("zephon W=2", same), Run("zephon W=2 fault@1 -> W=1", same)]
    assert panel_titles([*identical, *standard]) == (
        "zephon_torch: curves coincide",
        "standard loader: W changes data",
    )
    diverging = [Run("zephon W=2", same), Run("zephon W=2 fault@1 -> W=1", other)]
    assert panel_titles([*diverging, *standard])[0] == "zephon_torch: DIVERGES (see the verdicts)"
    failed = [*identical[:1], Run("zephon W=2 fault@1 -> W=1", [], error="DataError: x")]
    assert "DIVERGES" in panel_titles([*failed, *standard])[0]


def test_a_resumed_run_that_fails_under_plot_is_a_diverges_verdict_with_the_picture(
    tmp_path: Path, tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --plot the failed resume of a recipe whose map is not pure ended the command with
    exit code 2 and no verdict; without --plot it is a DIVERGES verdict (exit code 1)."""
    tokenizer.save(str(tmp_path / "tok.json"))
    recipe = tmp_path / "shrinking_plot.py"
    recipe.write_text(SHRINKING.format(path=str(tmp_path / "tok.json")))
    out = tmp_path / "diverges.png"
    argv = ["verify", str(recipe), "--plot", str(out), "--steps", "5", "--world-sizes", "4,1"]
    assert main(argv) == 1
    text = capsys.readouterr().out
    assert "zephon W=4 fault@2 -> W=1: DIVERGES: the run failed: DataError:" in text
    assert "verdict: zephon_torch DIVERGES" in text and png_size(out)[0] > 0


def test_the_tiny_model_learns_from_the_labels_and_leaves_their_masked_positions_out() -> None:
    import torch

    from zephon_torch._plot import IGNORED, VOCAB, train_losses, training_pair

    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    labels = torch.tensor([[6, IGNORED, 8, IGNORED], [10, 11, 12 + VOCAB, IGNORED]])
    inputs, targets = training_pair(
        [{"input_ids": ids[:1], "labels": labels[:1]}, {"input_ids": ids[1:], "labels": labels[1:]}]
    )
    assert torch.equal(inputs, ids)
    assert targets.tolist() == [[6, IGNORED, 8, IGNORED], [10, 11, 12, IGNORED]]
    # a run without labels (the standard loader's) learns each row's next token
    _, shifted = training_pair([{"input_ids": ids}])
    assert shifted.tolist() == [[6, 7, 8, IGNORED], [10, 11, 12, IGNORED]]

    # the masked positions (a document boundary, padding) are not learnt as the next token is
    assert train_losses([(inputs, targets)] * 2) != train_losses([(inputs, shifted)] * 2)
    changed = targets.clone()
    changed[1, 3] = 13  # a masked position counted
    assert train_losses([(inputs, changed)] * 2) != train_losses([(inputs, targets)] * 2)
    # a batch of padding alone counts no loss and takes no step
    padding = torch.full_like(targets, IGNORED)
    assert train_losses([(inputs, padding), (inputs, targets)]) == [
        0.0,
        train_losses([(inputs, targets)])[0],
    ]
