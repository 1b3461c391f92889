"""A tokenizer encode still running as the interpreter exits is waited for: a thread stopped
inside one aborted the process with tokenizers before 0.23 ("FATAL: exception not rethrown",
exit code 134, after a loop left by `break` on a busy machine)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from zephon_torch.ops._encodes import Encodes, Exiting

_LEFT_MID_ENCODE = """
import sys, threading, time
import zephon_torch._lanes as lanes
from zephon_torch import Pipeline
from zephon_torch._corpus import pydoc_prose_documents, small_tokenizer
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource

marks = open(sys.argv[1], "a")

calls = []
second_started = threading.Event()

def watch(frame, event, arg):  # each encode's start and end, on the runner's thread
    if frame.f_code.co_name != "encode_texts":
        return
    if event == "call":
        calls.append(time.monotonic())
        if len(calls) == 2:
            second_started.set()
    elif event == "return":
        marks.write(f"encoded {time.monotonic()}\\n")
        marks.flush()

lanes._LEAVE_S = 0.0  # leaving the loop waits no second for the running chunk
tokenizer = small_tokenizer(__import__("pathlib").Path(sys.argv[2]))
prose = " ".join(doc["text"] for doc in pydoc_prose_documents())
# the first chunk (32 documents) is quick; the second holds a long one, encoded for seconds
texts = ["a short one"] * 32 + [prose * 4] + ["a short one"] * 31
source = StaticMixtureWorkSource([Dataset.from_dict("d", {"text": texts})], shuffle=False)
pipeline = (
    Pipeline(source)
    .options(canonical_replicas=1, prefetch=0)  # one lane; batches made on this thread
    .tokenize(tokenizer=tokenizer, parallelism=1, runner="threads")
)
threading.setprofile(watch)  # the runner's thread starts with the iteration
for batch in pipeline.pack_flat(16).batch(1):
    # the loop is left only once the long document's encode has begun (else, on a busy
    # machine, the runner may not have started it yet and the exit has nothing to wait for)
    if not second_started.wait(120):
        sys.exit("the second chunk's encode never started")
    break
marks.write(f"left {time.monotonic()}\\n")
marks.flush()
"""


def test_a_loop_left_while_a_chunk_is_encoded_exits_after_the_encode_ends(
    tmp_path: Path,
) -> None:
    """Leaving the loop waits a second for the runner's running chunk (here not at all, so
    that the encode of a long document surely outlasts it), and the encode was cut off by the
    interpreter's teardown. Now the exit waits for it: its end is seen, after the loop was
    left."""
    script = tmp_path / "left.py"
    script.write_text(_LEFT_MID_ENCODE)
    marks = tmp_path / "marks"
    done = subprocess.run(
        [sys.executable, str(script), str(marks), str(tmp_path / "tokenizer.json")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = marks.read_text().split()
    events = list(zip(lines[::2], map(float, lines[1::2]), strict=True))
    # the first chunk's encode, the loop left, then the long one's encode ended
    assert [name for name, _ in events] == ["encoded", "left", "encoded"], events


def test_no_encode_starts_once_the_exit_waits_and_a_forked_child_starts_afresh() -> None:
    encodes = Encodes()
    with encodes.running():
        assert not encodes.drain(timeout=0.05)  # one running: not drained in time
    assert encodes.drain(timeout=0.05)
    with pytest.raises(Exiting, match="the interpreter is exiting"), encodes.running():
        pass
    encodes.reset()  # as in a forked child
    with encodes.running():
        pass
