"""Ranks whose process group was set up without RANK/WORLD_SIZE in the environment (as under
``torch.multiprocessing.spawn``), with spawned DataLoader workers: a spawned worker has no
process group, so it must not resolve the rank itself."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp
import torch.utils.data
from tokenizers import Tokenizer

from tests.helpers import destroy_process_group, small_pipeline, two_sources

_ITEMS = 8


def _digest(item: dict[str, Any]) -> str:
    return hashlib.sha256(item["input_ids"].numpy().tobytes()).hexdigest()[:16]


def _join(rank: int, world_size: int, folder: str, timeout_s: float | None = None) -> None:
    """Joins the process group through a file in `folder`, with no RANK/WORLD_SIZE in the
    environment (as under `torch.multiprocessing.spawn`). With a `timeout_s`, once every rank
    has come this far: gloo connects the ranks within the group's timeout, and a loaded
    machine's spawned ranks, importing torch in 10 to 40 s, may come seconds apart."""
    import datetime

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        os.environ.pop(name, None)
    if timeout_s is not None:
        _wait_for_every_rank(rank, world_size, folder, "joining")
    timeout = {} if timeout_s is None else {"timeout": datetime.timedelta(seconds=timeout_s)}
    dist.init_process_group(
        "gloo", init_method=f"file://{folder}/group", rank=rank, world_size=world_size, **timeout
    )


def _wait_for_every_rank(rank: int, world_size: int, folder: str, mark: str) -> None:
    """Leaves this rank's `mark` in `folder` and waits for every rank's."""
    Path(folder, f"{mark}{rank}").touch()
    _wait_for_marks(folder, [f"{mark}{other}" for other in range(world_size)])


def _wait_for_marks(folder: str, names: list[str]) -> None:
    """Waits until every file of `names` is in `folder` (at most 300 s)."""
    deadline = time.monotonic() + 300
    while not all(Path(folder, name).exists() for name in names):
        if time.monotonic() > deadline:
            return
        time.sleep(0.01)


def _rank(rank: int, world_size: int, folder: str) -> None:
    _join(rank, world_size, folder)
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
    destroy_process_group()


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


def _lone_state_rank(rank: int, world_size: int, folder: str) -> None:
    """Rank 0 takes the loader's state alone (inside `if rank == 0:`), then both ranks run
    one training all-reduce on the default group, and destroy the process group, which frees
    the loader's group too."""
    import weakref

    import torch

    from zephon_torch.errors import ZephonError
    from zephon_torch.torch import DataLoader
    from zephon_torch.torch.distributed import loader_group

    _join(rank, world_size, folder, _LONE_TIMEOUT_S)
    tokenizer = Tokenizer.from_file(f"{folder}/tokenizer.json")
    loader = DataLoader(small_pipeline(tokenizer, lanes=2, exhaustion="repeat"))
    _wait_for_every_rank(rank, world_size, folder, "built")  # its group's set-up: the timeout
    next(iter(loader))
    got: dict[str, Any] = {}
    if rank == 0:
        try:
            loader.state_dict()
        except ZephonError as error:
            got["error"] = str(error)
        Path(folder, "rank0_done").touch()
    else:  # a longer step: its all-reduce starts once rank 0's wait is over, within its timeout
        _wait_for_rank_0(folder)
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    got["sum"] = total.item()
    made = weakref.ref(loader_group())  # the group the loader made at its first iteration
    destroy_process_group()
    got["freed"] = made() is None
    Path(folder, f"rank{rank}.json").write_text(json.dumps(got))


_LONE_TIMEOUT_S = 6


def _wait_for_rank_0(folder: str) -> None:
    """Waits for rank 0's mark that its calls alone are over, so that this rank's next
    collective meets rank 0's within the group's timeout: a sleep a second past that timeout
    had guessed as much, which a loaded machine's rank 0, slow to build its loader, need
    not have made true."""
    _wait_for_marks(folder, ["rank0_done"])


def test_a_state_taken_on_one_rank_fails_clearly_and_leaves_the_training_collectives_alone(
    tmp_path: Path, tokenizer: Tokenizer
) -> None:
    """The gather ran on the default group: rank 0's call paired with rank 1's training
    all-reduce (a wrong sum, or a hang until the timeout with torch's own message). On the
    loader's own group it waits out the timeout, says why, and the all-reduce is untouched."""
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    mp.spawn(_lone_state_rank, args=(2, str(tmp_path)), nprocs=2, join=True)
    first, second = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert first["sum"] == second["sum"] == 3.0
    # kept on to the interpreter's exit, it aborted 1 exit in 20 there, after the abandoned gather
    assert first["freed"] and second["freed"]
    assert "error" not in second
    assert "every rank calls state_dict() at the same step" in first["error"], first["error"]
    assert "0:00:06" in first["error"]


def _data_parallel_rank(process: int, processes: int, folder: str) -> None:
    """Four processes as 2 data-parallel ranks x 2 tensor-parallel peers (processes 2r and
    2r + 1 are data-parallel rank r)."""
    from zephon_torch.errors import ConfigError
    from zephon_torch.torch import DataLoader

    _join(process, processes, folder)
    tokenizer = Tokenizer.from_file(f"{folder}/tokenizer.json")

    def pipeline(**options: int) -> Any:
        built = small_pipeline(tokenizer, lanes=4, exhaustion="repeat", datasets=two_sources())
        return built.options(**options)

    got: dict[str, Any] = {}
    try:  # every process takes itself for data-parallel rank 0: rank 1's lanes have no one
        next(iter(DataLoader(pipeline(world_size=2, rank=0))))
    except ConfigError as error:
        got["misconfigured"] = str(error)
    loader = DataLoader(pipeline(world_size=2, rank=process // 2))
    stream = iter(loader)
    got["batches"] = [_digest(next(stream)) for _ in range(_ITEMS // 2)]
    got["state"] = loader.state_dict()
    dist.barrier()
    if process == 0:  # a loader of its own (evaluation on rank 0): no collective
        alone = DataLoader(pipeline(world_size=1))
        got["alone"] = [_digest(item) for _, item in zip(range(_ITEMS), alone)]
        got["alone_lanes"] = sorted(alone.state_dict()["lanes"])
    dist.barrier()
    Path(folder, f"rank{process}.json").write_text(json.dumps(got))
    destroy_process_group()


def test_replicas_of_a_data_parallel_rank_get_its_batches_and_one_state(
    tmp_path: Path, tokenizer: Tokenizer
) -> None:
    """Under tensor parallelism every process took itself for a data-parallel rank of its
    own: peers that must see one batch got different ones, and `world_size=2` on 4 processes
    was refused, as was a `world_size=1` loader on one rank."""
    from zephon_torch import Pipeline

    tokenizer.save(str(tmp_path / "tokenizer.json"))
    mp.spawn(_data_parallel_rank, args=(4, str(tmp_path)), nprocs=4, join=True)
    one = small_pipeline(tokenizer, lanes=4, exhaustion="repeat", datasets=two_sources())
    reference = [_digest(b.to_training()) for _, b in zip(range(2 * _ITEMS), one)]
    got = [json.loads((tmp_path / f"rank{p}.json").read_text()) for p in range(4)]
    for process, part in enumerate(got):
        assert "no process holds data-parallel rank(s) [1] of 2" in part["misconfigured"]
        lanes = (0, 1) if process < 2 else (2, 3)
        expected = [reference[4 * turn + lane] for turn in range(_ITEMS // 4) for lane in lanes]
        assert part["batches"] == expected, process
        assert part["state"] == got[0]["state"]
    assert got[0]["alone"] == reference[:_ITEMS]
    assert got[0]["alone_lanes"] == ["0", "1", "2", "3"]
    resumed = small_pipeline(tokenizer, lanes=4, exhaustion="repeat", datasets=two_sources())
    assert isinstance(resumed, Pipeline)
    resumed.load_state_dict(got[0]["state"])
    after = [_digest(b.to_training()) for _, b in zip(range(4), resumed)]
    assert after == reference[_ITEMS // 2 * 2 : _ITEMS // 2 * 2 + 4]


def _lone_loader_rank(rank: int, world_size: int, folder: str) -> None:
    """Rank 0 alone iterates a loader of the whole world, then one of its own."""
    from zephon_torch.errors import ZephonError
    from zephon_torch.torch import DataLoader

    _join(rank, world_size, folder, _LONE_TIMEOUT_S)
    tokenizer = Tokenizer.from_file(f"{folder}/tokenizer.json")
    got: dict[str, Any] = {}
    if rank == 0:
        for attempt in ("first", "again"):
            start = time.monotonic()
            try:
                next(iter(DataLoader(small_pipeline(tokenizer, lanes=2, exhaustion="repeat"))))
            except ZephonError as error:
                got[attempt] = [str(error), time.monotonic() - start]
        alone = small_pipeline(tokenizer, lanes=2, exhaustion="repeat").options(world_size=1)
        got["alone"] = _digest(next(iter(DataLoader(alone))))
        Path(folder, "rank0_done").touch()
    else:
        _wait_for_rank_0(folder)
    dist.barrier()
    Path(folder, f"rank{rank}.json").write_text(json.dumps(got))
    destroy_process_group()


def test_a_loader_iterated_on_one_rank_says_to_make_it_its_own(
    tmp_path: Path, tokenizer: Tokenizer
) -> None:
    """Its group's set-up timed out with a message about gloo's network interface, and a second
    try made another group, out of step with every other process's next one for good."""
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    mp.spawn(_lone_loader_rank, args=(2, str(tmp_path)), nprocs=2, join=True)
    got = json.loads((tmp_path / "rank0.json").read_text())
    first, again = got["first"], got["again"]
    assert "on rank 0 alone: give such a loader `options(world_size=1)`" in first[0], first[0]
    assert again[0] == first[0] and again[1] < 1.0  # the failure, at once, not another group
    one = small_pipeline(tokenizer, lanes=2, exhaustion="repeat")
    assert got["alone"] == _digest(next(iter(one)).to_training())


def test_the_end_of_stream_all_reduce_runs_on_the_cpu_under_another_default_device() -> None:
    """Under `torch.set_default_device("cuda")` the flag the ranks all-reduce each step to end
    a `stop` stream together was made on the GPU, where it waits for the training's queued
    work, which the loader's collectives never do (the meta device stands in for a GPU: there
    the flag could not be read at all)."""
    from zephon_torch.torch.distributed import equal_ending

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        items = iter([{"n": 3}, {"n": 0}, {"n": 0}, {"n": 2}, {"n": 0}, {"n": 0}])
        with torch.device("meta"):
            got = list(equal_ending(items, lanes_per_turn=2, tokens=lambda item: item["n"]))
    finally:
        destroy_process_group()
    assert got == [{"n": 3}, {"n": 0}, {"n": 0}, {"n": 2}]
