"""Lightning under torchrun: a checkpoint taken at a step's end, mid-step or at an epoch's end
resumes on fewer devices with the same optimizer steps (`lightning_job.py`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch


def _lightning_run(
    nproc: int, out: Path, tokenizer_path: Path, *extra: str
) -> dict[int, list[str]]:
    """A torchrun Lightning job (`lightning_job.py`): each optimizer step's micro-batch
    digests, rank by rank (so lane by lane, as one process trains them)."""
    from tests.helpers import run_torchrun

    out.mkdir(parents=True, exist_ok=True)
    args = ("--tokenizer", str(tokenizer_path), "--out", str(out), *extra)
    done = run_torchrun("lightning_job.py", nproc, *args)
    assert done.returncode == 0, done.stderr[-3000:]
    steps: dict[int, list[str]] = {}
    for rank in range(nproc):
        for step, digest in json.loads((out / f"seen_{rank}.json").read_text()):
            steps.setdefault(step, []).append(digest)
    return steps


def test_a_step_end_checkpoint_resumes_on_fewer_devices_with_the_same_optimizer_steps(
    tmp_path: Path, tokenizer: Any
) -> None:
    """Lightning restores its per-rank batch count and steps the optimizer at its multiples of
    accumulate_grad_batches: a W=2 checkpoint at step 3 (count 6) resumed on W=1 (L/W = 4)
    stepped after 2 micro-batches, and every later step straddled two global batches, though
    the data came in order (review I, F1)."""
    tokenizer_path = tmp_path / "tokenizer.json"
    tokenizer.save(str(tokenizer_path))
    reference = _lightning_run(1, tmp_path / "w1", tokenizer_path)
    assert sorted(reference) == list(range(6)) and all(len(v) == 4 for v in reference.values())
    assert _lightning_run(2, tmp_path / "w2", tokenizer_path) == reference
    checkpoint = str(tmp_path / "w2" / "epoch=0-step=3.ckpt")
    resumed = _lightning_run(1, tmp_path / "w2to1", tokenizer_path, "--ckpt", checkpoint)
    assert resumed == {step: reference[step] for step in (3, 4, 5)}


def test_a_checkpoint_saved_again_mid_step_after_a_resume_resumes_in_step_on_one_device(
    tmp_path: Path, tokenizer: Any
) -> None:
    """After a resume with accumulate_grad_batches > 1, Lightning's every_n_train_steps saves
    the resumed step's checkpoint again after its first micro-batch, mid-step (the same file
    name in the same folder). Resumed on one process, Lightning stepped after 1 of the 2
    micro-batches left in the step, and every later optimizer step straddled two global
    batches, though the data came in order."""
    tokenizer_path = tmp_path / "tokenizer.json"
    tokenizer.save(str(tokenizer_path))
    reference = _lightning_run(1, tmp_path / "w1", tokenizer_path)
    _lightning_run(2, tmp_path / "w2", tokenizer_path)
    step_end = str(tmp_path / "w2" / "epoch=0-step=3.ckpt")
    again = _lightning_run(2, tmp_path / "again", tokenizer_path, "--ckpt", step_end)
    assert again == {step: reference[step] for step in (3, 4, 5)}
    mid_step = tmp_path / "again" / "epoch=0-step=3.ckpt"
    lanes = torch.load(mid_step, weights_only=False)["PipelineDataModule"]["zephon"]["lanes"]
    assert [lanes[str(lane)]["turn"] for lane in range(4)] == [4, 3, 4, 3]  # lanes 0, 2 done
    resumed = _lightning_run(1, tmp_path / "mid", tokenizer_path, "--ckpt", str(mid_step))
    assert resumed == {3: reference[3][1::2], 4: reference[4], 5: reference[5]}


def test_a_checkpoint_of_a_data_module_of_another_name_resumes_on_fewer_devices_in_step(
    tmp_path: Path, tokenizer: Any
) -> None:
    """Lightning keeps a data module's state under its class name and loads the loader's state
    it keeps beside it: a module saved under another name (a subclass renamed) resumed from
    that alone, where the batch count was not aligned, and on one process every optimizer
    step straddled two global batches."""
    tokenizer_path = tmp_path / "tokenizer.json"
    tokenizer.save(str(tokenizer_path))
    reference = _lightning_run(1, tmp_path / "w1", tokenizer_path)
    _lightning_run(2, tmp_path / "w2", tokenizer_path)
    saved = torch.load(tmp_path / "w2" / "epoch=0-step=3.ckpt", weights_only=False)
    saved["MyDataModule"] = saved.pop("PipelineDataModule")
    torch.save(saved, tmp_path / "renamed.ckpt")
    resumed = _lightning_run(
        1, tmp_path / "w1b", tokenizer_path, "--ckpt", str(tmp_path / "renamed.ckpt")
    )
    assert resumed == {step: reference[step] for step in (3, 4, 5)}


def test_an_epoch_end_checkpoint_resumes_on_fewer_devices_in_the_next_epoch(
    tmp_path: Path, tokenizer: Any
) -> None:
    """Epochs of 2 steps (limit_train_batches): the W=2 checkpoint at epoch 0's last step,
    resumed on W=1. Realigning Lightning's batch count dropped its mark of the epoch's last
    batch, so the resumed fit ran epoch 0 again on the next batches: 2 steps past the
    uninterrupted run's 6, every later epoch shifted by one."""
    tokenizer_path = tmp_path / "tokenizer.json"
    tokenizer.save(str(tokenizer_path))
    epochs = ("--epoch-steps", "2", "--every", "2")
    reference = _lightning_run(2, tmp_path / "w2", tokenizer_path, *epochs)
    assert sorted(reference) == list(range(6)) and all(len(v) == 4 for v in reference.values())
    checkpoint = str(tmp_path / "w2" / "epoch=0-step=2.ckpt")
    resumed = _lightning_run(1, tmp_path / "w1", tokenizer_path, *epochs, "--ckpt", checkpoint)
    assert resumed == {step: reference[step] for step in range(2, 6)}


def test_a_checkpoint_saved_again_mid_step_in_a_later_epoch_resumes_in_step_on_one_device(
    tmp_path: Path, tokenizer: Any
) -> None:
    """Epochs of 2 steps: the W=2 fit resumed from step 3 (epoch 1) saves that checkpoint
    again after the step's first micro-batch. Its step was told as one global step by the
    epoch's optimizer steps (1) against the lanes' turns (3), so it was left unaligned: on
    one process step 3 got 1 of the 2 micro-batches left, and every later step straddled
    two global batches."""
    tokenizer_path = tmp_path / "tokenizer.json"
    tokenizer.save(str(tokenizer_path))
    epochs = ("--epoch-steps", "2", "--every", "3")
    reference = _lightning_run(2, tmp_path / "w2", tokenizer_path, *epochs)
    step_end = str(tmp_path / "w2" / "epoch=1-step=3.ckpt")
    again = _lightning_run(2, tmp_path / "again", tokenizer_path, *epochs, "--ckpt", step_end)
    assert again == {step: reference[step] for step in (3, 4, 5)}
    mid_step = str(tmp_path / "again" / "epoch=1-step=3.ckpt")  # lanes 0 and 2 of step 3 done
    resumed = _lightning_run(1, tmp_path / "mid", tokenizer_path, *epochs, "--ckpt", mid_step)
    assert resumed == {3: reference[3][1::2], 4: reference[4], 5: reference[5]}
