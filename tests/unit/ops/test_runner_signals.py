"""The job's signals and the programs that the processes of ``runner="processes"`` run (a map
that calls ``subprocess``): they leave the group's Ctrl-C and SIGTERM to the loop, as the
processes do."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tests.helpers import group_ended, interrupt_group

_SHELLS_OUT = """
import os, signal, subprocess, time
from pathlib import Path

from zephon_torch import Pipeline
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource


def shells_out_at_forty(row):
    if row["ids"][0] == 40:
        Path(os.environ["HELPER_MARK"]).touch()
        subprocess.run(["sleep", "4"], check=True)  # a helper program: a converter, a lookup
    return row


if __name__ == "__main__":
    stopping = []
    signum = getattr(signal, os.environ["OWN_HANDLER"])
    signal.signal(signum, lambda *_: stopping.append(time.monotonic()))
    data = Dataset.from_dict("d", {"ids": [[i, 2, 2] for i in range(200)]}, shard_size=8)
    recipe = Pipeline(StaticMixtureWorkSource([data], exhaustion="repeat", shuffle=False))
    recipe = recipe.map(shells_out_at_forty)
    pipeline = recipe.pretokenized("ids", runner="processes", parallelism=2).pack_flat(8)
    print("ready", flush=True)
    for batch in pipeline.batch(1):
        if stopping and time.monotonic() - stopping[0] > 6:  # past the helper's end
            print("checkpointed", flush=True)
            break
        time.sleep(0.01)  # the training step
"""


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM"])
def test_a_program_a_map_runs_outlasts_the_signal_the_loop_takes(tmp_path: Path, name: str) -> None:
    """A map's helper program inherits both signals ignored: the group's Ctrl-C or SIGTERM,
    which the loop takes to checkpoint, leaves it running and the map's call succeeds (one that
    died of it failed the map, and the loop, before its checkpoint). Pinned: a worker that
    caught them instead of ignoring them would give them back to its programs."""
    script = tmp_path / "shells_out.py"
    script.write_text(_SHELLS_OUT)
    mark = tmp_path / "helper"

    def helper_running(_: int) -> bool:
        return mark.exists()

    group, out, err = interrupt_group(
        script, helper_running, getattr(signal, name), OWN_HANDLER=name, HELPER_MARK=str(mark)
    )
    assert out == "checkpointed\n" and err == "", err
    assert group_ended(group), "a process outlived the loop"
