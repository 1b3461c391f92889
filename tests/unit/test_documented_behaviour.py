"""What the README and the CLI help promise, held to the code: a tokenizer object as
`tokenize`'s first argument, verify's fault step inside the run, demo's settings positive."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.unit.test_verify import write_recipe
from zephon_torch import ConfigError, Pipeline
from zephon_torch.cli import main
from zephon_torch.io import Dataset
from zephon_torch.verify import load_recipe, verify
from zephon_torch.work import StaticMixtureWorkSource


def _source() -> StaticMixtureWorkSource:
    rows = [{"text": f"document {i} " * (i % 7 + 1)} for i in range(24)]
    return StaticMixtureWorkSource([Dataset.from_dict("d", rows)], seed=0)


def test_tokenize_takes_a_tokenizer_object_as_its_first_argument(tokenizer: Any) -> None:
    # README.md:74 `.tokenize("path/to/tokenizer_dir", ...)  # hub id, dir, or object`
    positional = Pipeline(_source()).tokenize(tokenizer, parallelism=1).pack_flat(32).batch(2)
    keyword = (
        Pipeline(_source()).tokenize(tokenizer=tokenizer, parallelism=1).pack_flat(32).batch(2)
    )
    assert positional.fingerprint() == keyword.fingerprint()
    first = next(iter(positional)).input_ids
    assert (first == next(iter(keyword)).input_ids).all()
    with pytest.raises(ConfigError, match="exactly one of"):
        Pipeline(_source()).tokenize(tokenizer, tokenizer=tokenizer)


def test_verify_refuses_a_fault_step_outside_the_run(tmp_path: Path, tokenizer: Any) -> None:
    build = load_recipe(write_recipe(tmp_path, tokenizer, "recipe"))
    with pytest.raises(ConfigError, match="fault_step"):
        verify(
            build, steps=2, world_sizes=[1, 2], workers=(), fault_step=3, standard=False, runners=()
        )


def test_verify_cli_with_few_steps_keeps_its_default_fault_inside_the_run(
    tmp_path: Path, tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    # `zephon-torch verify RECIPE --steps 2`: the default --fault-step (3) lay after the run's
    # end, so the resumed run had 3 steps against 2 and the verdict read DIVERGES (exit 1)
    recipe = write_recipe(tmp_path, tokenizer, "recipe")
    argv = [
        "verify",
        str(recipe),
        "--steps",
        "2",
        "--world-sizes",
        "1,2",
        "--workers",
        "",
        "--runners",
        "",
        "--no-standard",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "fault@1 -> W=1: IDENTICAL" in out and "DIVERGES" not in out


@pytest.mark.parametrize("flag", ["--steps", "--lanes", "--max-length", "--microbatch-size"])
def test_demo_refuses_a_non_positive_setting_at_once(flag: str) -> None:
    # `zephon-torch demo --steps 0` ran forever (the loop ends at step == steps * lanes)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "zephon_torch.cli",
            "demo",
            "--lanes",
            "1",
            "--max-length",
            "8",
            "--microbatch-size",
            "1",
            flag,
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 2
    assert "must be a positive integer" in done.stderr


def test_non_integer_counts_are_config_errors_naming_them() -> None:
    """A float count failed later with a raw TypeError ("slice indices must be integers"), and
    a numpy int went into the fingerprint, which json could not write."""
    from zephon_torch.work import TokenEstimation

    dataset = Dataset.from_dict("d", [{"text": "a b"}] * 4)
    with pytest.raises(ConfigError, match="`shuffle_window_shards`"):
        StaticMixtureWorkSource([dataset], shuffle_window_shards=2.5)  # type: ignore[arg-type]
    for setting in ("canonical_replicas", "read_ahead", "world_size"):
        with pytest.raises(ConfigError, match=f"`{setting}`"):
            Pipeline(StaticMixtureWorkSource([dataset])).options(**{setting: 2.0})
    with pytest.raises(ConfigError, match="`stats_every`"):
        Pipeline(StaticMixtureWorkSource([dataset])).options(stats_every=1.5)  # type: ignore[arg-type]
    options = Pipeline(StaticMixtureWorkSource([dataset])).options(
        canonical_replicas=np.int64(4), world_size=np.int32(2), rank=np.int64(1)
    )
    assert type(options._options.canonical_replicas) is int
    assert type(options._options.rank) is int
    with pytest.raises(ConfigError, match=r"`tokens_per_byte` names unknown datasets \['D'\]"):
        StaticMixtureWorkSource(
            [dataset], token_estimation=TokenEstimation(tokens_per_byte={"D": 0.3})
        )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--runners", "inline"], "runners are threads and processes, got ['inline']"),
        (["--train"], "verify --train draws loss curves: it needs --plot"),
    ],
)
def test_verify_refuses_what_it_would_ignore(
    tmp_path: Path,
    tokenizer: Any,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    message: str,
) -> None:
    """An unknown runner was dropped and --train without --plot did nothing, under a verdict
    that still read IDENTICAL."""
    recipe = write_recipe(tmp_path, tokenizer, "recipe")
    with pytest.raises(SystemExit) as caught:
        main(["verify", str(recipe), "--steps", "2", *extra])
    assert caught.value.code == 2
    assert message in capsys.readouterr().err


def test_demo_and_verify_report_a_zephon_error_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As inspect and index do: demo printed two chained tracebacks for a missing tokenizer,
    and verify a bare AttributeError for a recipe whose pipeline() is no Pipeline."""
    from zephon_torch.cli import main

    missing = str(tmp_path / "no-such-tokenizer")
    assert main(["demo", "--tokenizer", missing, "--steps", "1"]) == 2
    out, printed = capsys.readouterr()  # no tokenizer is trained where one is given
    assert out == "building the demo corpus (cached after the first run) ...\n"
    err = printed.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("zephon-torch demo: error: cannot load tokenizer")
    recipe = tmp_path / "five.py"
    recipe.write_text("def pipeline():\n    return 5\n")
    assert main(["verify", str(recipe), "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"zephon-torch verify: error: recipe {str(recipe)!r}: `pipeline()` must return a "
        "Pipeline, got int"
    ]
