"""A plain PyTorch training loop with gradient accumulation, elastic across GPU counts.

    python examples/train_loop.py --steps 20                              # one process
    torchrun --nproc_per_node=4 examples/train_loop.py --steps 20 --save-at 8 --checkpoint ck.pt
    torchrun --nproc_per_node=2 examples/train_loop.py --steps 20 --resume ck.pt   # on 2 ranks
    torchrun --nproc_per_node=2 examples/train_loop.py --steps 20 --resume ck.pt --micro-batch 2

The global batch is 4 rows from each of the L canonical lanes. A rank owns L/W lanes, and
takes each lane's 4 rows as 4/m micro-batches of m rows (`--micro-batch`, a performance knob:
the rows are the same for every m), so it runs (L/W) x (4/m) accumulation micro-steps per
optimizer step: with fewer GPUs, or less memory per GPU, each one accumulates more. The data
hash of a step is over its rows as a set, since the order of micro-batches within a step
follows m. The loss is normalised by the *global* number of target tokens
in the step and gradients are summed over ranks, so the update is the same for every W (up to
floating-point summation order), and the data is the same bit for bit. (DDP and FSDP average
gradients over ranks instead of summing them: there, multiply that loss by W.)

On GPUs each rank uses the GPU of its LOCAL_RANK under NCCL; the loader's own collectives run
on a gloo group it makes. The counts and hashes are read from the batches before they move to
the GPU, so the loop never waits for the GPU to learn them.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.torch_version import TorchVersion

from zephon_torch.demo import demo_pipeline
from zephon_torch.torch import DataLoader, to_device


class TinyLM(torch.nn.Module):
    def __init__(self, vocab: int, width: int = 64) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.mix = torch.nn.Linear(width, width)
        self.head = torch.nn.Linear(width, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mix(self.embed(input_ids))))


def accumulate(
    model: torch.nn.Module, micro: list[dict[str, torch.Tensor]], tokens: torch.Tensor
) -> torch.Tensor:
    """Backward over each micro-batch, the loss normalised by the step's global token count
    (`tokens`, on the model's device); returns the summed loss there."""
    step_loss = torch.zeros((), dtype=torch.float64, device=tokens.device)
    for m in micro:
        logits = model(m["input_ids"])
        # labels are shifted already: labels[t] is the token after input_ids[t]
        loss_sum = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), m["labels"].flatten(), ignore_index=-100, reduction="sum"
        )
        (loss_sum / tokens).backward()
        step_loss += loss_sum.detach().double()
    return step_loss


def save(
    path: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: DataLoader,
    step: int,
) -> None:
    """Checkpoint model, optimizer and data position (the data state is gathered: a collective)."""
    data = loader.state_dict()
    if not dist.is_initialized() or dist.get_rank() == 0:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
        torch.save({**state, "data": data, "step": step}, path)


def load(
    path: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    loader: DataLoader,
    device: torch.device,
) -> int:
    """Restore a checkpoint saved on any rank count dividing L onto this rank's `device`;
    returns its step."""
    checkpoint = torch.load(path, map_location=device, weights_only=False)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    loader.load_state_dict(checkpoint["data"])
    return int(checkpoint["step"])


def start_process() -> tuple[bool, torch.device]:
    """Whether this is a torchrun job (its process group started), and this rank's device:
    the GPU of its LOCAL_RANK under NCCL, else the CPU under gloo."""
    distributed = "WORLD_SIZE" in os.environ
    device = torch.device("cpu")
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)  # this rank's GPU, for NCCL and all_gather_object
    if distributed:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return distributed, device


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lanes", type=int, default=4, help="canonical_replicas L")
    parser.add_argument("--out", default=None, help="write per-step loss and data hash as JSON")
    parser.add_argument("--save-at", type=int, default=-1, help="checkpoint after this many steps")
    parser.add_argument("--checkpoint", default="checkpoint.pt", help="where --save-at writes")
    parser.add_argument("--resume", default=None, help="a checkpoint to continue from")
    parser.add_argument("--micro-batch", type=int, default=4, help="rows a micro-batch: 1, 2 or 4")
    args = parser.parse_args()
    if args.micro_batch not in (1, 2, 4):
        parser.error("--micro-batch must divide the 4 rows each lane gives a step: 1, 2 or 4")

    distributed, device = start_process()
    world = dist.get_world_size() if distributed else 1

    pipeline = demo_pipeline(
        canonical_replicas=args.lanes, max_length=256, microbatch_size=args.micro_batch
    )
    loader = DataLoader(pipeline, pin_memory=device.type == "cuda")
    # micro-batches per rank per optimizer step: 4 rows of each of its L/W lanes
    accumulation = args.lanes // world * (4 // args.micro_batch)

    torch.manual_seed(0)
    model = TinyLM(vocab=8192).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    start = load(args.resume, model, optimizer, loader, device) if args.resume else 0
    stream = iter(loader)
    log = []
    for step in range(start, args.steps):
        on_host = [next(stream) for _ in range(accumulation)]
        count = sum(int(m["num_valid_tokens"]) for m in on_host)
        mine = [
            hashlib.sha256(row.numpy().tobytes()).hexdigest()
            for m in on_host
            for row in m["input_ids"]
        ]
        micro = [to_device(m, device) for m in on_host]
        tokens = torch.tensor(count, dtype=torch.float64, device=device)
        if distributed:
            dist.all_reduce(tokens)  # the global target-token count of this step
        step_loss = accumulate(model, micro, tokens)
        if distributed:
            for p in model.parameters():
                if p.grad is not None:
                    dist.all_reduce(p.grad)
            dist.all_reduce(step_loss)
            parts: list[list[str]] = [[] for _ in range(world)]
            dist.all_gather_object(parts, mine)
            mine = [h for part in parts for h in part]
        data_hash = hashlib.sha256("".join(sorted(mine)).encode()).hexdigest()  # the rows' set
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        log.append({"step": step, "loss": (step_loss / tokens).item(), "data": data_hash})
        if not distributed or dist.get_rank() == 0:
            print(f"step {step:3d}  loss {log[-1]['loss']:.4f}")
        if step + 1 == args.save_at:
            save(args.checkpoint, model, optimizer, loader, step + 1)
    if args.out and (not distributed or dist.get_rank() == 0):
        Path(args.out).write_text(json.dumps(log))
    if distributed:
        leave_process_group()


def leave_process_group() -> None:
    """Every rank leaves together, then destroys the process group.

    torch 2.4 (at least) can deadlock in `destroy_process_group()`: a gloo thread still
    freeing the last collective's tensors waits for the GIL the destroying thread holds. A
    moment without the GIL lets it finish (a 4-rank gloo script on 2.4.1: 5 of 6 runs hung
    without it, 12 of 12 ended with it)."""
    dist.barrier()
    if TorchVersion(torch.__version__) < (2, 8):
        time.sleep(0.2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
