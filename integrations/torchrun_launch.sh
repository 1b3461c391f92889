#!/usr/bin/env bash
# Launch the example training loop with torchrun, checkpoint on 4 ranks, resume on 2, then 1.
# The data position travels in the checkpoint; every run sees the global batches of one
# uninterrupted run (examples/train_loop.py prints per-step losses to compare).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
$PY -m torch.distributed.run --standalone --nproc_per_node=4 examples/train_loop.py \
    --steps 12 --save-at 6 --checkpoint /tmp/zephon-ck.pt --out /tmp/zephon-w4.json
$PY -m torch.distributed.run --standalone --nproc_per_node=2 examples/train_loop.py \
    --steps 12 --resume /tmp/zephon-ck.pt --out /tmp/zephon-w2.json
$PY examples/train_loop.py --steps 12 --resume /tmp/zephon-ck.pt --out /tmp/zephon-w1.json
$PY - <<'PY'
import json
full = json.load(open("/tmp/zephon-w4.json"))[6:]
for name in ("w2", "w1"):
    run = json.load(open(f"/tmp/zephon-{name}.json"))
    same = [a["data"] == b["data"] for a, b in zip(full, run)]
    print(f"resumed on {name}: data identical at every step: {all(same)}")
PY
