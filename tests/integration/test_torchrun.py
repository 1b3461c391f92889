"""Real torchrun jobs (gloo, CPU): checkpoint on 4 ranks, resume on 2 and on 1, same batches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def torchrun(nproc: int, out: Path, tokenizer_path: Path, *extra: str) -> dict[str, str]:
    out.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
        str(ROOT / "tests" / "integration" / "torchrun_job.py"),
        "--tokenizer", str(tokenizer_path), "--out", str(out), *extra,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    steps: dict[str, str] = json.loads((out / "steps.json").read_text())
    return steps


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any) -> Path:
    path = tmp_path_factory.mktemp("torchrun") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def test_a_four_rank_checkpoint_resumes_on_two_and_one_rank_with_identical_global_batches(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    steps, cut = 12, 5
    four = torchrun(
        4, tmp_path / "w4", tokenizer_path, "--steps", str(steps), "--save-at", str(cut)
    )
    one_fresh = torchrun(1, tmp_path / "w1", tokenizer_path, "--steps", str(steps))
    assert four == one_fresh
    assert len(four) == steps
    state = tmp_path / "w4" / "state.json"
    assert json.loads(state.read_text())["step"] == cut
    two = torchrun(2, tmp_path / "r2", tokenizer_path, "--steps", str(steps), "--load", str(state))
    one = torchrun(1, tmp_path / "r1", tokenizer_path, "--steps", str(steps), "--load", str(state))
    expected = {k: v for k, v in four.items() if int(k) >= cut}
    assert two == expected
    assert one == expected


def test_ranks_with_dataloader_workers_give_the_same_global_batches(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    plain = torchrun(2, tmp_path / "plain", tokenizer_path, "--steps", "6")
    workers = torchrun(2, tmp_path / "workers", tokenizer_path, "--steps", "6", "--workers", "2")
    assert plain == workers


def test_with_a_finite_dataset_every_rank_ends_on_the_same_step(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    one = torchrun(1, tmp_path / "one", tokenizer_path, "--steps", "0", "--exhaustion", "stop")
    four = torchrun(4, tmp_path / "four", tokenizer_path, "--steps", "0", "--exhaustion", "stop")
    assert len(one) > 5
    assert four == one  # same steps, same global batches, padding where a lane ran out
