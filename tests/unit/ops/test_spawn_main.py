"""Functions spawned processes cannot find: a map of a `python -c` command, of a script read
from stdin, or defined under the main guard. The processes of `runner="processes"` and
spawned DataLoader workers refuse them with a `ConfigError` saying why, not the advice to add
the main guard that a broken pool gave."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

_RECIPE = """
from zephon_torch import Pipeline
from zephon_torch.io import Dataset
from zephon_torch.torch import DataLoader
from zephon_torch.work import StaticMixtureWorkSource


def tag(row):
    return row


def run(runner, workers):
    data = Dataset.from_dict("d", {"ids": [[1, 2, 3]] * 8})
    recipe = Pipeline(StaticMixtureWorkSource([data], shuffle=False)).map(tag)
    pipeline = recipe.pretokenized("ids", runner=runner, parallelism=1).pack_flat(8).batch(1)
    try:
        if workers:
            loader = DataLoader(pipeline, num_workers=1, multiprocessing_context="spawn")
            print(sum(1 for _ in loader))
        else:
            print(sum(1 for _ in pipeline))
    except Exception as error:
        print(type(error).__name__, error)
"""

_UNLOADABLE = """
from zephon_torch import Pipeline
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource

if __name__ == "__main__":
    def tag(row):
        return row

    data = Dataset.from_dict("d", {"ids": [[1, 2, 3]] * 8})
    recipe = Pipeline(StaticMixtureWorkSource([data], shuffle=False)).map(tag)
    pipeline = recipe.pretokenized("ids", runner="processes", parallelism=1).pack_flat(8)
    try:
        print(sum(1 for _ in pipeline.batch(1)))
    except Exception as error:
        print(type(error).__name__, error)
"""


def _outcomes(how: str, cwd: Path) -> list[str]:
    """What each run of ``_RECIPE`` printed, its code given by ``how`` ("-c", "stdin")."""
    code = _RECIPE + "\nrun('processes', False)\nrun('threads', True)\nrun('threads', False)\n"
    command = [sys.executable, "-c", code] if how == "-c" else [sys.executable, "-"]
    done = subprocess.run(
        command,
        input=None if how == "-c" else code,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=cwd,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_a_map_of_a_python_c_command_is_refused_by_spawned_processes_naming_it(
    tmp_path: Path,
) -> None:
    """Its workers failed to unpickle `__main__.tag` and broke the pool, whose error said to
    run the pipeline under `if __name__ == "__main__":`, which cannot help there."""
    pool, loader, threads = _outcomes("-c", tmp_path)
    for outcome, who, instead in [
        (pool, "the processes of runner='processes'", "use runner='threads'"),
        (loader, "the DataLoader workers started by 'spawn'", "use 'fork'"),
    ]:
        assert outcome.startswith(f"ConfigError {who} cannot receive `__main__.tag`")
        assert "a `python -c` command" in outcome and outcome.endswith(instead)
    assert threads == "3"  # threads need no pickling


def test_a_script_read_from_stdin_is_refused_by_spawned_processes(tmp_path: Path) -> None:
    """Every spawned process tried to run the file `<stdin>` again and died, with the same
    advice of a main guard."""
    pool, loader, threads = _outcomes("stdin", tmp_path)
    for outcome, who in [
        (pool, "the processes of runner='processes'"),
        (loader, "the DataLoader workers started by 'spawn'"),
    ]:
        assert outcome.startswith(f"ConfigError {who} cannot start")
        assert "names '<stdin>', which is no file to run" in outcome
    assert threads == "3"


def test_spawned_processes_with_nothing_of_main_to_find_run_from_a_python_c_command(
    tmp_path: Path,
) -> None:
    """Only what they would need of `__main__` is refused: a recipe of library parts alone
    runs from `python -c`."""
    code = _RECIPE.replace(".map(tag)", "") + "\nrun('processes', False)\n"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=tmp_path,
    )
    assert done.stdout == "3\n", done.stdout + done.stderr


def test_a_map_defined_under_the_main_guard_is_named_as_one_spawned_processes_cannot_find(
    tmp_path: Path,
) -> None:
    """The worker's failure to unpickle it broke the pool, whose error advised the main guard
    the script already has."""
    script = tmp_path / "guarded.py"
    script.write_text(_UNLOADABLE)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=240, check=False
    )
    assert done.stdout.startswith(
        "ConfigError the processes of runner='processes' could not load the pipeline's "
        "functions: Can't get attribute 'tag' on <module '__mp_main__'"
    ), done.stdout + done.stderr
    assert 'not under `if __name__ == "__main__":`' in done.stdout
    assert "BrokenProcessPool" not in done.stderr


def test_a_loader_without_workers_leaves_the_start_method_to_be_set_later(
    tmp_path: Path,
) -> None:
    """Looking for what spawned workers could not find asked the default context its start
    method at every loop, which fixes it: a later `multiprocessing.set_start_method` (a quick
    look at the data first, then the training set-up) was 'context has already been set'."""
    code = _RECIPE + (
        "\nimport multiprocessing\n"
        "print(sum(1 for _ in DataLoader(Pipeline(StaticMixtureWorkSource("
        "[Dataset.from_dict('d', {'ids': [[1, 2, 3]] * 8})]))"
        ".pretokenized('ids').pack_flat(8).batch(1), num_workers=0)))\n"
        "multiprocessing.set_start_method('spawn')\n"
        "print(multiprocessing.get_start_method())\n"
    )
    script = tmp_path / "late_start_method.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=240, check=False
    )
    assert done.stdout == "3\nspawn\n", done.stdout + done.stderr
