"""The job's Ctrl-C and SIGTERM (a terminal's, a scheduler's before its SIGKILL) reach the whole
process group, DataLoader workers too: they leave them to the training loop, whose own handler
checkpoints and stops, and the workers end with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from itertools import islice
from pathlib import Path

import pytest

from tests.helpers import ROOT, group_ended, interrupt_group, run_group
from tests.integration.signalled_job import pipeline
from zephon_torch.torch import DataLoader

JOB = ROOT / "tests" / "integration" / "signalled_job.py"


def _workers_spawning(job: int) -> bool:
    """Whether both workers of ``job`` are spawned: they import for seconds then."""
    command = ["pgrep", "-P", str(job), "-f", "spawn_main"]
    return len(subprocess.run(command, capture_output=True, check=False).stdout.split()) == 2


def _at_once(_: int) -> bool:
    return True


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM"])
@pytest.mark.parametrize(
    ("start", "when"), [("fork", "started"), ("spawn", "started"), ("spawn", "starting")]
)
def test_a_loop_that_takes_the_signal_itself_checkpoints_and_resumes_exactly(
    tmp_path: Path, name: str, start: str, when: str
) -> None:
    """Its own handler of Ctrl-C, or of Slurm's SIGTERM ("stop after the next checkpoint"),
    kept the loop going, but each worker had died of the same signal (still importing, too):
    "DataLoader worker (pid ...) exited unexpectedly" (SIGTERM), or an EOFError from
    multiprocessing's resource_sharer (SIGINT), and no state was saved."""
    ready = _workers_spawning if when == "starting" else _at_once
    env = {"START": start, "OWN_HANDLER": name, "READY": when}
    _checkpoints_and_resumes_exactly(tmp_path, ready, getattr(signal, name), **env)


def test_a_loop_that_takes_sigterm_checkpoints_where_the_program_started_the_fork_server(
    tmp_path: Path,
) -> None:
    """multiprocessing's fork server, started by the program itself (an earlier Pool here),
    died of the group's SIGTERM, and the workers it had forked then ended (their parent gone):
    "DataLoader worker (pid(s) ...) exited unexpectedly", and no state was saved. The workers
    now come from a fork server of the loader's own, which leaves both signals to the loop."""
    env = {"START": "forkserver", "OWN_HANDLER": "SIGTERM", "PROGRAM_FORKSERVER": "1"}
    _checkpoints_and_resumes_exactly(tmp_path, _at_once, signal.SIGTERM, **env)


def _checkpoints_and_resumes_exactly(
    tmp_path: Path, ready: Callable[[int], bool], signum: int, **env: str
) -> None:
    """`signalled_job` run with ``env``, sent ``signum`` once ``ready``: it checkpoints, leaves
    no process, and its state resumes where it stopped."""
    saved = tmp_path / "saved.json"
    group, out, err = interrupt_group(JOB, ready, signum, SAVED=str(saved), **env)
    assert out == "checkpointed\n" and err == "", err
    assert group_ended(group), "a worker outlived the loop"

    job = json.loads(saved.read_text())
    count = len(job["received"])
    expected = [b.to_training()["input_ids"].tolist() for b in islice(pipeline(), count + 6)]
    assert job["received"] == expected[:count]
    resumed = DataLoader(pipeline())
    resumed.load_state_dict(job["state"])
    assert [b["input_ids"].tolist() for b in islice(resumed, 6)] == expected[count:]


_A_POOL_AFTER_THE_LOADER = """
import multiprocessing, time
from itertools import islice

from tests.integration.signalled_job import pipeline
from zephon_torch.torch import DataLoader

if __name__ == "__main__":
    loader = DataLoader(pipeline(), num_workers=2, multiprocessing_context="forkserver")
    print(len(list(islice(loader, 4))), flush=True)
    own = multiprocessing.get_context("forkserver").Process(target=time.sleep, args=(300,))
    own.start()
    own.terminate()  # as a Pool's at the end of its `with` block
    own.join(20)
    print(own.exitcode, flush=True)
    own.kill()
"""


def test_the_program_s_own_fork_server_processes_after_the_loader_s_take_sigterm(
    tmp_path: Path,
) -> None:
    """The loader started multiprocessing's fork server with SIGINT and SIGTERM blocked, which
    every process the program started from it later inherited: one of the program's own ignored
    its terminate() (a Pool's at the end of its `with` block, whose join then waited for ever).
    """
    script = tmp_path / "pool_after.py"
    script.write_text(_A_POOL_AFTER_THE_LOADER)
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = run_group([sys.executable, str(script)], env=environment, timeout=90)
    assert done.returncode == 0 and done.stdout == "4\n-15\n", done.stderr


_BIG_BATCHES_LEFT_IN_FLIGHT = """
import sys
from itertools import islice

from zephon_torch import Pipeline
from zephon_torch.io import Dataset
from zephon_torch.torch import DataLoader
from zephon_torch.work import StaticMixtureWorkSource

if __name__ == "__main__":
    rows = {"ids": [[i % 89 + 1] * 4096 for i in range(64)]}
    source = StaticMixtureWorkSource(
        [Dataset.from_dict("d", rows, shard_size=8)], seed=3, exhaustion="repeat"
    )
    recipe = Pipeline(source).options(canonical_replicas=2)
    recipe = recipe.pretokenized("ids").pack_flat(2**20).batch(8)  # 64 MiB of ids a batch
    loader = DataLoader(recipe, num_workers=2, multiprocessing_context="spawn")
    print(len(list(islice(loader, 4))), flush=True)
"""


def test_spawned_workers_stopped_while_sending_a_batch_end_without_aborting(
    tmp_path: Path,
) -> None:
    """A loop that stopped early left each worker's queue sending the batch it had just made.
    A spawned worker then ended through the interpreter's shutdown, which stopped that sending
    thread inside torch's C++ (sharing the tensors): "terminate called without an active
    exception", and "DataLoader worker (pid ...) is killed by signal: Aborted" in the main
    process, in 6 of 6 runs of this job before the fix (and in one CI run of the small job
    above).
    """
    script = tmp_path / "big_batches.py"
    script.write_text(_BIG_BATCHES_LEFT_IN_FLIGHT)
    environment = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = run_group([sys.executable, str(script)], env=environment, timeout=120)
    assert done.returncode == 0 and done.stdout == "4\n", done.stderr
    assert done.stderr == ""


def _stalled(folder: Path) -> bool:
    """Whether both workers are in the slow map, and the loop has got nothing for 2 s: each
    worker is inside a fetch (its read-ahead used up), as torch's shutdown finds it."""
    received = folder / "received"
    return (
        len(list(folder.glob("slow.*"))) == 2
        and received.exists()
        and time.time() - received.stat().st_mtime > 2
    )


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_ctrl_c_ends_a_job_whose_workers_are_in_a_slow_map(tmp_path: Path, start: str) -> None:
    """A worker ignores the group's SIGTERM, but not its parent's: torch ends a worker that does
    not stop by SIGTERM, and multiprocessing terminates the workers still running at exit,
    then waits for them."""

    def stalled(_: int) -> bool:
        (tmp_path / "go").touch()
        return _stalled(tmp_path)

    group, _, err = interrupt_group(JOB, stalled, signal.SIGINT, START=start, SLOW=str(tmp_path))
    assert err.count("Traceback") == 1 and err.rstrip().endswith("KeyboardInterrupt"), err
    assert group_ended(group, within=20), "a worker outlived the interrupted loop"
