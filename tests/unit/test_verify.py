"""verify: identical hashes for zephon_torch across configurations, and it can fail."""

from __future__ import annotations

import io
import os
import pickle
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_progress import FakeTerminal
from zephon_torch._verdict import is_setup_error
from zephon_torch.errors import ConfigError
from zephon_torch.verify import Run, load_recipe, standard_run, table, verdict, verify

RECIPE = """
from pathlib import Path
from tokenizers import Tokenizer
from tests.helpers import small_pipeline, two_sources

TOKENIZER = Tokenizer.from_file({path!r})
DATASETS = two_sources(40, 30, shard_size=8)

def pipeline():
    return small_pipeline(TOKENIZER, lanes=4, exhaustion="repeat", datasets=DATASETS{extra})
"""


def write_recipe(tmp_path: Path, tokenizer: Any, name: str, extra: str = "") -> Path:
    tokenizer.save(str(tmp_path / "tok.json"))
    path = tmp_path / f"{name}.py"
    path.write_text(RECIPE.format(path=str(tmp_path / "tok.json"), extra=extra))
    return path


def test_verify_finds_every_configuration_identical_and_the_standard_loader_not(
    tmp_path: Path, tokenizer: Any
) -> None:
    build = load_recipe(write_recipe(tmp_path, tokenizer, "recipe"))
    runs = verify(build, steps=6, workers=(), fault_step=2, runners=("processes",))
    zephon = [r for r in runs if r.zephon]
    assert [r.name for r in zephon][:3] == ["zephon W=1", "zephon W=2", "zephon W=4"]
    assert all(r.hashes == zephon[0].hashes and len(r.hashes) == 6 for r in zephon)
    standard = [r for r in runs if not r.zephon]
    assert len({tuple(r.hashes) for r in standard}) == len(standard)  # W changes its batches
    # each global batch hashed whole and by lane, the fault runs' across their resume too
    assert all(r.parts is not None and len(r.parts) == len(r.hashes) == 6 for r in zephon)
    assert all(len(step) == 4 for r in zephon for step in r.parts or [])
    text = table(runs)
    assert "zephon W=1: the reference (6 steps)" in text  # not "IDENTICAL to" itself
    assert "zephon W=4 fault@2 -> W=1: IDENTICAL" in text
    assert "zephon W=1 runner=processes: IDENTICAL" in text
    assert "standard W=2: DIVERGES from standard W=1 at step 0" in text
    assert "standard W=1: the standard loader's reference (6 steps)" in text  # not itself


def test_verify_reports_a_divergence_when_a_data_affecting_setting_differs(
    tmp_path: Path, tokenizer: Any
) -> None:
    base = load_recipe(write_recipe(tmp_path, tokenizer, "base"))
    changed = load_recipe(write_recipe(tmp_path, tokenizer, "changed", extra=", max_length=48"))
    a = verify(base, steps=4, world_sizes=[2], workers=(), standard=False)[0]
    b = verify(changed, steps=4, world_sizes=[2], workers=(), standard=False)[0]
    assert verdict(b, a) == "DIVERGES from zephon W=2 at step 0 (lane 0 first)"


def test_a_divergence_names_the_first_lane_whose_micro_batch_differs() -> None:
    """A DIVERGES line named the step alone: which of the L micro-batches differed (a lane
    resumed wrong, one rank's data) was for the user to find."""
    same, other = "1" * 64, "2" * 64
    reference = Run("zephon W=1", ["a" * 64, "b" * 64], parts=[[same, same], [same, same]])
    run = Run("zephon W=2", ["a" * 64, "c" * 64], parts=[[same, same], [same, other]])
    assert verdict(run, reference) == "DIVERGES from zephon W=1 at step 1 (lane 1 first)"
    fewer = Run("zephon W=2", ["a" * 64, "c" * 64], parts=[[same, same], [same]])
    assert verdict(fewer, reference).endswith("at step 1 (1 micro-batches vs 2)")
    unknown = Run("zephon W=2", ["a" * 64, "c" * 64])  # no per-lane hashes: the step alone
    assert verdict(unknown, reference) == "DIVERGES from zephon W=1 at step 1"


def test_the_standard_baseline_diverges_across_world_sizes(tmp_path: Path, tokenizer: Any) -> None:
    build = load_recipe(write_recipe(tmp_path, tokenizer, "recipe"))
    one, two = standard_run(build, 1, 3), standard_run(build, 2, 3)
    assert len(one) == len(two) == 3 and one != two


def test_verify_draws_a_progress_bar_over_configurations_only_on_a_terminal(
    tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    build = load_recipe(write_recipe(tmp_path, tokenizer, "recipe"))
    quiet = io.StringIO()
    monkeypatch.setattr(sys, "stderr", quiet)
    verify(build, steps=2, world_sizes=[1, 2], workers=(), standard=False)
    assert quiet.getvalue() == ""
    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    verify(build, steps=2, world_sizes=[1, 2], workers=(), standard=False)
    assert "verify [" in terminal.getvalue() and "2/2" in terminal.getvalue()
    assert terminal.getvalue().endswith("\n")


def test_a_finite_recipe_run_past_its_end_is_identical_on_every_world_size(
    tmp_path: Path, tokenizer: Any
) -> None:
    """Simulated ranks each stopped at their own first empty turn, and the runs were cut to
    the shortest: DIVERGES for a recipe the loader under torch.distributed gives exactly."""
    tokenizer.save(str(tmp_path / "tok.json"))
    finite = RECIPE.replace('exhaustion="repeat"', 'exhaustion="stop"')
    (tmp_path / "finite.py").write_text(finite.format(path=str(tmp_path / "tok.json"), extra=""))
    build = load_recipe(tmp_path / "finite.py")
    steps = sum(1 for _ in build()) // 4 + 5  # past the end
    runs = verify(build, steps=steps, workers=(), fault_step=2, standard=False)
    assert all(r.hashes == runs[0].hashes for r in runs)
    assert 0 < len(runs[0].hashes) < steps
    assert "DIVERGES" not in table(runs)


def test_a_finite_recipe_is_identical_with_workers_and_a_fault_after_a_rank_ran_out(
    tmp_path: Path, tokenizer: Any
) -> None:
    """With workers, a simulated rank of several ended at its own first empty turn; and a
    fault state saved after a rank's lanes ran out held them at their last real turn. Both
    were reported DIVERGES for a recipe the loader gives exactly under torch.distributed."""
    tokenizer.save(str(tmp_path / "tok.json"))
    finite = RECIPE.replace('exhaustion="repeat"', 'exhaustion="stop"')
    (tmp_path / "finite.py").write_text(finite.format(path=str(tmp_path / "tok.json"), extra=""))
    build = load_recipe(tmp_path / "finite.py")
    real = verify(build, steps=200, world_sizes=[1], workers=(), standard=False, runners=())
    count = len(real[0].hashes)
    runs = verify(
        build,
        steps=count + 3,
        world_sizes=[2, 1, 4],
        workers=(2,),
        fault_step=count - 1,
        standard=False,
        runners=(),
    )
    assert [r.name for r in runs][-3:] == [
        "zephon W=2 workers=2",
        f"zephon W=4 fault@{count - 1} -> W=2",
        f"zephon W=2 loader workers=2 fault@{count - 1} -> W=4",
    ]
    assert all(r.hashes == real[0].hashes for r in runs), table(runs)


FILTERED = """
from tokenizers import Tokenizer
from tests.helpers import two_sources
from zephon_torch import Pipeline
from zephon_torch.work import StaticMixtureWorkSource

TOKENIZER = Tokenizer.from_file({path!r})


def long_enough(row):
    return len(row["text"]) > 20


def pipeline():
    source = StaticMixtureWorkSource(
        two_sources(40, 30, shard_size=8), {{"long": 0.6, "short": 0.4}}, seed=1,
        exhaustion="repeat",
    )
    return (
        Pipeline(source).options(canonical_replicas=4).filter(long_enough)
        .tokenize(tokenizer=TOKENIZER, parallelism=1).pack_flat(64, "wrap").batch(2)
    )
"""


def test_a_recipe_s_own_functions_reach_spawned_workers_and_processes(
    tmp_path: Path, tokenizer: Any
) -> None:
    """The recipe was loaded as a module no other process could import: a filter defined in
    it failed to pickle for the default verify (spawned DataLoader workers, processes
    runner)."""
    tokenizer.save(str(tmp_path / "tok.json"))
    (tmp_path / "filtered_recipe.py").write_text(FILTERED.format(path=str(tmp_path / "tok.json")))
    build = load_recipe(tmp_path / "filtered_recipe.py")
    runs = verify(build, steps=3, world_sizes=[1], workers=(2,), standard=False)
    assert [r.name for r in runs] == [
        "zephon W=1",
        "zephon W=1 workers=2",
        "zephon W=1 runner=processes",
    ]
    assert all(r.hashes == runs[0].hashes and len(r.hashes) == 3 for r in runs)
    (tmp_path / "json.py").write_text("")
    with pytest.raises(ConfigError, match="file name is that of the module 'json'"):
        load_recipe(tmp_path / "json.py")


@pytest.mark.parametrize(
    "arguments",
    [
        ["--workers", "a"],
        ["--world-sizes", "0"],
        ["--world-sizes", "1,,2"],
        ["--fault-step", "-1"],
        # --plot ran its own runs without them, and could read IDENTICAL where they fail
        ["--plot", "p.png", "--workers", "0"],
        ["--plot", "p.png", "--runners", ""],
        ["--plot", "p.png", "--no-standard"],
    ],
)
def test_verify_s_malformed_arguments_are_usage_errors(
    tmp_path: Path, tokenizer: Any, arguments: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """They were bare ValueErrors (exit 1), as was a missing recipe file."""
    from zephon_torch.cli import main

    recipe = write_recipe(tmp_path, tokenizer, "recipe")
    for argv in (["verify", str(recipe), *arguments], ["verify", str(tmp_path / "none.py")]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        assert "error:" in capsys.readouterr().err


SHRINKING = """
import collections
from tokenizers import Tokenizer
from tests.helpers import two_sources
from zephon_torch import Pipeline
from zephon_torch.work import StaticMixtureWorkSource

TOKENIZER = Tokenizer.from_file({path!r})

READS = collections.Counter()

def cut(row):  # not pure: each read of a row is a word shorter than the one before
    READS[row["text"]] += 1
    words = row["text"].split()
    return {{**row, "text": " ".join(words[: max(1, len(words) - READS[row["text"]])])}}

def pipeline():
    source = StaticMixtureWorkSource(two_sources(40, 30, shard_size=8), seed=7)
    recipe = Pipeline(source).options(canonical_replicas=4).map(cut)
    return recipe.tokenize(tokenizer=TOKENIZER, parallelism=1).pack_flat(64).batch(2)
"""


def test_a_configuration_that_fails_is_reported_as_diverging_not_a_crash(
    tmp_path: Path, tokenizer: Any
) -> None:
    """The resumed run of a recipe whose map is not pure failed (its saved pieces lay past
    the documents read anew): verify ended in a traceback, with no table or verdict."""
    from zephon_torch.cli import main

    tokenizer.save(str(tmp_path / "tok.json"))
    recipe = tmp_path / "shrinking.py"
    recipe.write_text(SHRINKING.format(path=str(tmp_path / "tok.json")))
    out = io.StringIO()
    argv = [
        "verify",
        str(recipe),
        "--steps",
        "5",
        "--no-standard",
        "--runners",
        "",
        "--workers",
        "",
    ]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "stdout", out)
        code = main(argv)
    text = out.getvalue()
    assert code == 1 and "verdict: zephon_torch DIVERGES" in text
    assert "DIVERGES: the run failed: DataError:" in text and "cannot resume here" in text


@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("def pipeline(:\n", "SyntaxError"),
        ("import not_a_module_of_zephon_tests\n", "ModuleNotFoundError"),
        ("raise RuntimeError('no data here')\n", "RuntimeError: no data here"),
    ],
)
def test_a_recipe_that_fails_to_import_is_one_error_line_and_exit_code_2(
    tmp_path: Path, code: str, error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its traceback ended verify with exit code 1, the code of DIVERGES."""
    from zephon_torch.cli import main

    recipe = tmp_path / "broken.py"
    recipe.write_text(code)
    with pytest.raises(ConfigError, match=f"recipe .*broken.py': cannot import: {error}"):
        load_recipe(recipe)
    assert main(["verify", str(recipe)]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert captured.err.startswith("zephon-torch verify: error: recipe ")


def test_a_recipe_whose_pipeline_raises_is_one_error_line_and_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It ended verify in a traceback with exit code 1, the code of DIVERGES."""
    from zephon_torch.cli import main

    recipe = tmp_path / "raising.py"
    recipe.write_text("def pipeline():\n    raise ValueError('recipe bug')\n")
    assert main(["verify", str(recipe)]) == 2
    assert capsys.readouterr().err == (
        f"zephon-torch verify: error: recipe {str(recipe)!r}: `pipeline()` raised ValueError: "
        "recipe bug\n"
    )


def test_verify_simulates_its_ranks_in_a_shell_that_names_a_rank(
    tmp_path: Path, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shell opened by torchrun, SLURM or a pod sets RANK and WORLD_SIZE: every simulated
    rank's options were checked against them, and each run with W > 1 failed to run."""
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    build = load_recipe(write_recipe(tmp_path, tokenizer, "recipe"))
    runs = verify(
        build, steps=2, world_sizes=[1, 2], workers=(), runners=(), fault_step=1, standard=False
    )
    assert [r.error for r in runs] == [None] * 4
    assert all(r.hashes == runs[0].hashes and len(r.hashes) == 2 for r in runs)
    assert (os.environ["WORLD_SIZE"], os.environ["RANK"]) == ("1", "0")  # given back


def test_steps_without_loss_targets_are_compared_and_no_step_is_no_verdict(tokenizer: Any) -> None:
    """A step inside a long chat prompt holds tokens but no label: verify took the first one
    for the end of the stream, and with none left compared, read IDENTICAL (exit 0)."""
    import warnings

    from zephon_torch import Pipeline
    from zephon_torch._verdict import EXIT_INCOMPLETE, overall
    from zephon_torch._verify_runs import zephon_batches
    from zephon_torch.io import Dataset
    from zephon_torch.work import StaticMixtureWorkSource

    talks = [
        [
            {"role": "user", "content": " ".join(["word"] * 60) + f" q{i}"},
            {"role": "assistant", "content": f"ok {i}"},
        ]
        for i in range(6)
    ]

    def build() -> Pipeline:
        source = StaticMixtureWorkSource([Dataset.from_dict("chat", {"messages": talks})], seed=1)
        recipe = Pipeline(source).tokenize_chat(tokenizer=tokenizer, parallelism=1)
        return recipe.pack_flat(16, "wrap").batch(1)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the small tokenizer has no chatml markers
        direct = list(build())
        steps = zephon_batches(build, 1, 1000)
    assert int(direct[0].to_training()["num_valid_tokens"]) == 0 < direct[0].num_tokens
    assert len(steps) == sum(b.num_tokens > 0 for b in direct) > 1
    assert overall([Run("zephon W=1", []), Run("zephon W=2", [])]) == (
        "INCOMPLETE: the configurations gave no step to compare (the recipe gave no data)",
        EXIT_INCOMPLETE,
    )


def test_a_verify_that_ran_only_the_reference_is_incomplete_not_identical() -> None:
    """`--world-sizes 1 --workers '' --runners '' --no-standard --fault-step 0` ran the
    reference alone and read "IDENTICAL across configurations", exit 0: nothing compared."""
    from zephon_torch._verdict import EXIT_IDENTICAL, EXIT_INCOMPLETE, overall

    said, code = overall([Run("zephon W=1", ["ab", "cd"])])
    assert code == EXIT_INCOMPLETE and said.startswith("INCOMPLETE: only the reference ran")
    twice = [Run("zephon W=1", ["ab", "cd"]), Run("zephon W=2", ["ab", "cd"])]
    assert overall(twice) == ("zephon_torch IDENTICAL across configurations", EXIT_IDENTICAL)


def test_a_long_run_with_workers_keeps_no_file_descriptor_per_batch(
    tmp_path: Path, tokenizer: Any
) -> None:
    """Each kept worker batch held a shared-memory file descriptor: a run of steps x lanes
    batches past the limit failed with "Too many open files" and read DIVERGES."""
    import subprocess

    recipe = write_recipe(tmp_path, tokenizer, "recipe")  # 4 lanes
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (160, 160))\n"
        "from zephon_torch.verify import load_recipe\n"
        "from zephon_torch._verify_runs import zephon_batches\n"
        f"build = load_recipe({str(recipe)!r})\n"
        "print(len(zephon_batches(build, 1, 60, num_workers=1)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "60"  # 240 batches kept, past 160 descriptors


UNPICKLABLE = """
from tokenizers import Tokenizer
from tests.helpers import small_pipeline, two_sources
from zephon_torch.ops.stateful import StatefulFilter

TOKENIZER = Tokenizer.from_file({path!r})
DATASETS = two_sources(40, 30, shard_size=8)


class KeepAll(StatefulFilter):
    name = "keep_all"

    def keep(self, tokens, source):
        return True

    def state_dict(self):
        return {{}}

    def load_state_dict(self, state):
        pass


def pipeline():
    recipe = small_pipeline(TOKENIZER, lanes=4, exhaustion="repeat", datasets=DATASETS)
    return recipe.stateful_filter(lambda lane: KeepAll())  # spawned workers cannot unpickle it
"""


def _verify_with_workers(
    recipe_text: str, tmp_path: Path, tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    """`zephon-torch verify` of ``recipe_text`` (formatted with the tokenizer's path) on W=1
    and 2, with 2 workers and a fault at step 1: its exit code and printed text."""
    from zephon_torch.cli import main

    tokenizer.save(str(tmp_path / "tok.json"))
    recipe = tmp_path / "recipe.py"
    recipe.write_text(recipe_text.format(path=str(tmp_path / "tok.json")))
    argv = ["verify", str(recipe), "--steps", "2", "--world-sizes", "1,2", "--workers", "2"]
    code = main([*argv, "--runners", "", "--no-standard", "--fault-step", "1"])
    return code, capsys.readouterr().out


@pytest.mark.filterwarnings("ignore:Got pickle error:UserWarning")
def test_a_configuration_that_cannot_run_is_reported_as_failed_to_run_not_diverging(
    tmp_path: Path, tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The workers run of a recipe whose stateful filter is made by a lambda cannot start
    (spawned workers need it pickled): it was reported DIVERGES, exit code 1, for a recipe
    whose every configuration that ran was identical."""
    code, text = _verify_with_workers(UNPICKLABLE, tmp_path, tokenizer, capsys)
    assert code == 3, text
    assert (
        "zephon W=1 workers=2: FAILED TO RUN: ConfigError: DataLoader workers started by "
        "'spawn' get the pipeline pickled" in text
    )
    assert "zephon W=2 fault@1 -> W=1: IDENTICAL" in text
    assert "zephon W=1 loader workers=2 fault@1 -> W=2: FAILED TO RUN" in text
    assert "verdict: INCOMPLETE: 2 of 5 configurations failed to run" in text
    assert "DIVERGES" not in text


def test_pickle_s_refusal_of_a_local_function_is_a_setup_error_in_every_python_s_words() -> None:
    """Python 3.13 words pickle's refusal of a local function "Can't get local object" (3.11
    and 3.12: "Can't pickle local object"): there, a recipe with a closure that spawned workers
    could not receive read DIVERGES, and the DataLoader raised pickle's bare AttributeError."""

    def local() -> None:
        pass

    with pytest.raises(AttributeError) as caught:
        pickle.dumps(local)
    assert is_setup_error(caught.value)
    for words in (
        "Can't pickle local object 'f.<locals>.g'",
        "Can't get local object 'f.<locals>.g'",
    ):
        assert is_setup_error(AttributeError(words))
    assert is_setup_error(TypeError("cannot pickle '_thread.lock' object"))
    assert not is_setup_error(AttributeError("'NoneType' object has no attribute 'text'"))


OS_ERROR_IN_WORKERS = """
import errno
import torch
from tokenizers import Tokenizer
from tests.helpers import two_sources
from zephon_torch import Pipeline
from zephon_torch.work import StaticMixtureWorkSource

TOKENIZER = Tokenizer.from_file({path!r})
DATASETS = two_sources(40, 30, shard_size=8)


def full_machine(row):
    if torch.utils.data.get_worker_info() is not None:  # the machine, not the data
        raise OSError(errno.EMFILE, "Too many open files")
    return row


def pipeline():
    source = StaticMixtureWorkSource(DATASETS, seed=7, exhaustion="repeat")
    recipe = Pipeline(source).options(canonical_replicas=4).map(full_machine)
    return recipe.tokenize(tokenizer=TOKENIZER).pack_flat(64).batch(2)
"""


# torch's iterator, dropped after its worker failed, finds the worker gone in its __del__
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_an_os_error_in_a_run_is_a_failure_to_run_not_a_divergence(
    tmp_path: Path, tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """An OSError (descriptors, disk, storage: StorageError is one) says nothing of
    determinism: the workers run that met one read DIVERGES, exit code 1."""
    code, text = _verify_with_workers(OS_ERROR_IN_WORKERS, tmp_path, tokenizer, capsys)
    assert code == 3, text
    assert "zephon W=1 workers=2: FAILED TO RUN: " in text
    assert "Too many open files" in text
    assert "zephon W=2 fault@1 -> W=1: IDENTICAL" in text
    assert "DIVERGES" not in text


def test_a_world_size_that_does_not_divide_the_lanes_is_refused_before_any_run(
    tmp_path: Path, tokenizer: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """With L=4, `--world-sizes 1,3` ran W=1, failed W=3 and reported DIVERGES (exit code 1);
    `--world-sizes 3` alone was a ConfigError (exit code 2)."""
    from zephon_torch.cli import main

    recipe = write_recipe(tmp_path, tokenizer, "recipe")
    for sizes in ("1,3", "3"):
        argv = ["verify", str(recipe), "--world-sizes", sizes, "--workers", "", "--steps", "2"]
        assert main([*argv, "--runners", "", "--no-standard"]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.count("\n") == 1
        assert captured.err == (
            "zephon-torch verify: error: `world_sizes` must divide canonical_replicas=4 "
            "(supported: [1, 2, 4]), got [3]\n"
        )


def test_a_standard_baseline_that_gave_no_step_is_not_compared_rather_than_identical() -> None:
    """Each standard run of 0 steps read "IDENTICAL to standard W=1 (0 steps)": the table
    showed the standard loader agreeing across world sizes with nothing compared."""
    zephon = [Run(f"zephon W={w}", ["a" * 64, "b" * 64]) for w in (1, 2)]
    standard = [Run(f"standard W={w}", [], zephon=False) for w in (1, 2)]
    shorter = Run("standard W=4", ["c" * 64], zephon=False)
    lines = table([*zephon, *standard, shorter]).splitlines()
    assert "standard W=1: not compared (0 steps): the standard loader gave 0 of 2 steps" in lines
    assert "standard W=2: not compared (0 steps): the standard loader gave 0 of 2 steps" in lines
    assert lines[-1] == (
        "standard W=4: not compared (0 steps): the standard loader gave 1 of 2 steps "
        "(0 on standard W=1)"
    )
    assert [line for line in lines if line.startswith("standard") and "IDENTICAL" in line] == []


def test_the_standard_baseline_of_a_repeating_recipe_reads_further_passes(
    tmp_path: Path, tokenizer: Any
) -> None:
    """It read one pass only: a repeating recipe over a small dataset gave the baseline fewer
    steps than asked (0 for a tiny one), so nothing was compared."""
    tokenizer.save(str(tmp_path / "tok.json"))
    build = load_recipe(write_recipe(tmp_path, tokenizer, "repeating"))
    one_pass = 40  # steps: more than the documents give in one pass
    runs = [standard_run(build, w, one_pass) for w in (1, 2)]
    assert [len(r) for r in runs] == [one_pass, one_pass] and runs[0] != runs[1]
    finite = RECIPE.replace('exhaustion="repeat"', 'exhaustion="stop"')
    (tmp_path / "once.py").write_text(finite.format(path=str(tmp_path / "tok.json"), extra=""))
    assert 0 < len(standard_run(load_recipe(tmp_path / "once.py"), 1, one_pass)) < one_pass
