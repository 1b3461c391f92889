"""Ranks whose process group was set up without RANK/WORLD_SIZE in the environment (as under
``torch.multiprocessing.spawn``), with spawned DataLoader workers: a spawned worker has no
process group, so it must not resolve the rank itself."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp
import torch.utils.data
from tokenizers import Tokenizer

from tests.helpers import small_pipeline, two_sources

_ITEMS = 8


def _digest(item: dict[str, Any]) -> str:
    return hashlib.sha256(item["input_ids"].numpy().tobytes()).hexdigest()[:16]


def _rank(rank: int, world_size: int, folder: str) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        os.environ.pop(name, None)
    dist.init_process_group(
        "gloo", init_method=f"file://{folder}/group", rank=rank, world_size=world_size
    )
    from zephon_torch.torch import DataLoader

    tokenizer = Tokenizer.from_file(f"{folder}/tokenizer.json")
    pipeline = small_pipeline(tokenizer, lanes=4, exhaustion="repeat", datasets=two_sources())
    got = {}
    for name, loader in (
        ("zephon", DataLoader(pipeline, num_workers=1, multiprocessing_context="spawn")),
        (
            "torch",
            torch.utils.data.DataLoader(
                pipeline.to_torch(), batch_size=None, num_workers=1, multiprocessing_context="spawn"
            ),
        ),
    ):
        got[name] = [_digest(item) for _, item in zip(range(_ITEMS), loader)]
    Path(folder, f"rank{rank}.json").write_text(json.dumps(got))
    dist.destroy_process_group()


def test_spawned_workers_of_ranks_without_the_environment_read_their_rank_s_lanes(
    tmp_path: Path, tokenizer: Tokenizer
) -> None:
    """They took themselves for rank 0 of 1: every rank trained on the one-rank stream."""
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    mp.spawn(_rank, args=(2, str(tmp_path)), nprocs=2, join=True)
    one = small_pipeline(tokenizer, lanes=4, exhaustion="repeat", datasets=two_sources())
    reference = [_digest(b.to_training()) for _, b in zip(range(2 * _ITEMS), one)]
    for rank, lanes in ((0, (0, 1)), (1, (2, 3))):
        expected = [reference[4 * turn + lane] for turn in range(_ITEMS // 2) for lane in lanes]
        got = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert got == {"zephon": expected, "torch": expected}, rank
