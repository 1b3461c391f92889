"""A Lightning DDP fit (CPU, gloo) with PipelineDataModule, run by torchrun for the tests.

Each rank writes ``seen_<rank>.json``: for every micro-batch it trained, the optimizer step it
went into and a digest of its ids. ``accumulate_grad_batches`` is L/W (one global batch per
optimizer step), and a checkpoint is saved every ``--every`` steps (at step ends).

    torchrun --nproc_per_node=W tests/integration/lightning_job.py --tokenizer T --out DIR
        [--lanes 4] [--max-steps 6] [--every 3] [--ckpt PATH] [--epoch-steps N]

With ``--epoch-steps N`` the fit runs by epochs of N optimizer steps (``limit_train_batches``
of N x L/W a rank, ``max_epochs`` of max-steps / N, no ``max_steps``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import lightning as L
import torch
from tokenizers import Tokenizer

from tests.helpers import small_pipeline, two_sources
from zephon_torch.lightning import PipelineDataModule


class Recorder(L.LightningModule):
    def __init__(self, out: Path) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(1024, 8)
        self.out = out
        self.seen: list[tuple[int, str]] = []

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        digest = hashlib.sha256(batch["input_ids"].numpy().tobytes()).hexdigest()[:16]
        self.seen.append((self.global_step, digest))
        return self.embed(batch["input_ids"]).float().mean()

    def on_train_end(self) -> None:
        (self.out / f"seen_{self.global_rank}.json").write_text(json.dumps(self.seen))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--lanes", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--every", type=int, default=3)
    parser.add_argument("--ckpt", default=None)
    parser.add_argument("--epoch-steps", type=int, default=None)
    args = parser.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    pipeline = small_pipeline(
        Tokenizer.from_file(args.tokenizer),
        lanes=args.lanes,
        exhaustion="repeat",
        datasets=two_sources(40, 30, shard_size=8),
    )
    torch.manual_seed(0)
    accumulate = args.lanes // world
    limits: dict[str, Any] = {"max_steps": args.max_steps}
    if args.epoch_steps:
        limits = {
            "max_epochs": args.max_steps // args.epoch_steps,
            "limit_train_batches": args.epoch_steps * accumulate,
        }
    checkpoints = L.pytorch.callbacks.ModelCheckpoint(
        dirpath=args.out, every_n_train_steps=args.every, save_top_k=-1
    )
    trainer = L.Trainer(
        accelerator="cpu",
        devices=world,
        strategy="ddp" if world > 1 else "auto",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=args.out,
        accumulate_grad_batches=accumulate,
        callbacks=[checkpoints],
        **limits,
    )
    trainer.fit(Recorder(args.out), datamodule=PipelineDataModule(pipeline), ckpt_path=args.ckpt)


if __name__ == "__main__":
    main()
