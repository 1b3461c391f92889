"""The job's Ctrl-C and SIGTERM (a terminal's, a scheduler's before its SIGKILL) reach the whole
process group, DataLoader workers too: they leave them to the training loop, whose own handler
checkpoints and stops, and the workers end with it."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from itertools import islice
from pathlib import Path

import pytest

from tests.helpers import ROOT, group_ended, interrupt_group
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
    saved = tmp_path / "saved.json"
    ready = _workers_spawning if when == "starting" else _at_once
    env = {"START": start, "SAVED": str(saved), "OWN_HANDLER": name, "READY": when}
    group, out, err = interrupt_group(JOB, ready, getattr(signal, name), **env)
    assert out == "checkpointed\n" and err == "", err
    assert group_ended(group), "a worker outlived the loop"

    job = json.loads(saved.read_text())
    count = len(job["received"])
    expected = [b.to_training()["input_ids"].tolist() for b in islice(pipeline(), count + 6)]
    assert job["received"] == expected[:count]
    resumed = DataLoader(pipeline())
    resumed.load_state_dict(job["state"])
    assert [b["input_ids"].tolist() for b in islice(resumed, 6)] == expected[count:]


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
