"""A training loop over DataLoader workers that a test sends the job's signals (see
``test_loader_signals``).

Run as ``python signalled_job.py`` with ``START`` (the workers' start method) and ``SAVED`` (a
file) set. It prints "ready" after 50 micro-batches (with ``READY=starting``: before its workers
start). With ``OWN_HANDLER=SIGINT`` or ``SIGTERM`` it takes that signal itself ("stop after the
next checkpoint"): it goes on for 3 micro-batches and to a step's end, writes what it received
and the loader's state to ``SAVED``, prints "checkpointed" and stops. With ``SLOW`` set to a
folder, its workers mark themselves there and take 300 s over each document once the file
``SLOW/go`` exists, and the loop touches ``SLOW/received`` at each micro-batch. With
``PROGRAM_FORKSERVER`` set, it first runs a Pool of multiprocessing's fork server, which it thus
starts itself (an earlier step of the job).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

from zephon_torch import Pipeline
from zephon_torch.io import Dataset
from zephon_torch.torch import DataLoader
from zephon_torch.work import StaticMixtureWorkSource

_STEPS_TO_CHECKPOINT = 3


def pipeline() -> Pipeline:
    """Two lanes of pre-tokenized documents, one per worker, for ever."""
    rows = {"ids": [[i % 89 + 1] * (i % 5 + 2) for i in range(3000)]}
    source = StaticMixtureWorkSource(
        [Dataset.from_dict("d", rows, shard_size=8)], seed=3, exhaustion="repeat"
    )
    recipe = Pipeline(source).options(canonical_replicas=2)
    if os.environ.get("SLOW"):
        recipe = recipe.map(_slow_once_told)
    return recipe.pretokenized("ids").pack_flat(16).batch(2)


def _slow_once_told(row: dict[str, Any]) -> dict[str, Any]:
    folder = Path(os.environ["SLOW"])
    if (folder / "go").exists():
        (folder / f"slow.{os.getpid()}").touch()
        time.sleep(300)  # a huge document, a remote lookup
    return row


def main() -> None:
    stopping: list[int] = []
    if os.environ.get("OWN_HANDLER"):
        signum = getattr(signal, os.environ["OWN_HANDLER"])
        signal.signal(signum, lambda *_: stopping.append(0))
    if os.environ.get("PROGRAM_FORKSERVER"):
        with multiprocessing.get_context("forkserver").Pool(1) as pool:
            pool.map(abs, [-1])
    loader = DataLoader(pipeline(), num_workers=2, multiprocessing_context=os.environ["START"])
    starting = os.environ.get("READY") == "starting"  # the signal lands as the workers start
    if starting:
        print("ready", flush=True)
    received = []
    for batch in loader:
        received.append(batch["input_ids"].tolist())
        if os.environ.get("SLOW"):
            Path(os.environ["SLOW"], "received").touch()  # its time: when the loop last got one
        if len(received) == 50 and not starting:
            print("ready", flush=True)
        if stopping:
            stopping.append(0)  # counts the micro-batches since the signal
        # at a step's end: one micro-batch of each of the 2 lanes
        if len(stopping) > _STEPS_TO_CHECKPOINT and len(received) % 2 == 0:
            saved = {"received": received, "state": loader.state_dict()}
            Path(os.environ["SAVED"]).write_text(json.dumps(saved))
            print("checkpointed", flush=True)
            break
        time.sleep(0.01)  # the training step


if __name__ == "__main__":
    main()
