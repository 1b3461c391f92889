"""Elastic splits: the lanes of the pipeline's global stream, and the global-batch slots of a
map-style dataset.

The lane arithmetic (which canonical lanes rank r of W owns: ``[r * L/W, (r+1) * L/W)``, so the
ranks' turn-t outputs in rank order are the turn-t global batch for every W dividing L) lives in
``zephon_torch._lane_split`` and is public here. ``ElasticDistributedSampler`` applies the same
split to a map-style dataset: G global-batch slots play the lanes, so the per-step union over
ranks is the same G indices for every W dividing G. The functions are keyword-only and pure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sized
from typing import Any

import numpy as np
import torch.distributed as dist
from torch.utils.data import DistributedSampler, Sampler

from zephon_torch._lane_split import (
    check_in_step,
    check_topology,
    lanes_for_rank,
    rank_turns,
    ranks_out_of_step,
    supported_world_sizes,
)
from zephon_torch.errors import (
    ConfigError,
    StateMismatchError,
    flag_setting,
    integer_setting,
)
from zephon_torch.work._hashing import stable_key
from zephon_torch.work._permutation import permute

__all__ = [
    "ElasticDistributedSampler",
    "check_in_step",
    "check_topology",
    "lanes_for_rank",
    "num_global_batches",
    "rank_indices",
    "rank_turns",
    "ranks_out_of_step",
    "supported_world_sizes",
]


_SAMPLER_STATE_VERSION = 1
_CHUNK_SAMPLES = 1 << 16  # indices a rank computes at a time: bounded memory, vectorised cost


def num_global_batches(*, dataset_len: int, global_batch_size: int, drop_last: bool) -> int:
    """Global batches in one epoch: the incomplete tail is dropped or padded to a whole batch."""
    dataset_len = _count_setting(dataset_len, "`dataset_len`")
    global_batch_size = integer_setting(global_batch_size, "`global_batch_size`")
    if global_batch_size < 1:
        raise ConfigError(f"`global_batch_size` must be positive, got {global_batch_size}")
    if flag_setting(drop_last, "`drop_last`"):
        return dataset_len // global_batch_size
    return -(-dataset_len // global_batch_size)


def rank_indices(
    *,
    dataset_len: int,
    global_batch_size: int,
    world_size: int,
    rank: int,
    seed: int,
    epoch: int,
    shuffle: bool,
    drop_last: bool,
    start_batch: int = 0,
    stop_batch: int | None = None,
) -> list[int]:
    """The dataset indices rank ``rank`` of ``world_size`` draws for global batches [start, stop).

    Stream position ``p`` of the epoch holds ``perm[p % dataset_len]``, where ``perm`` is the
    (seed, epoch)-keyed permutation (identity without ``shuffle``); the modulo pads the last
    global batch by wrapping around to the start of the same permutation. Global batch ``b`` is
    positions ``[b*G, (b+1)*G)`` and the rank takes the ``rank``-th of its ``world_size`` slices.
    Every argument is checked as the sampler checks it (``ConfigError`` naming it).
    """
    _check_split(global_batch_size=global_batch_size, world_size=world_size, rank=rank)
    global_batch_size, rank = int(global_batch_size), int(rank)
    share = global_batch_size // int(world_size)
    # A plain int seed and epoch: a numpy one would hash to another key (stable_key includes
    # types), and a float would be truncated to another epoch's permutation.
    seed = integer_setting(seed, "`seed`")
    epoch = _count_setting(epoch, "`epoch`")
    shuffle = flag_setting(shuffle, "`shuffle`")
    total = num_global_batches(
        dataset_len=dataset_len, global_batch_size=global_batch_size, drop_last=drop_last
    )
    start = integer_setting(start_batch, "`start_batch`")
    stop = total if stop_batch is None else integer_setting(stop_batch, "`stop_batch`")
    if not 0 <= start <= stop <= total:
        raise ConfigError(
            f"need 0 <= `start_batch` <= `stop_batch` <= {total}, got {start}, {stop}"
        )
    batches = np.arange(start, stop, dtype=np.int64)[:, None]
    offsets = np.arange(rank * share, (rank + 1) * share, dtype=np.int64)[None, :]
    positions = (batches * global_batch_size + offsets).reshape(-1) % max(int(dataset_len), 1)
    if shuffle:
        key = stable_key("ElasticDistributedSampler", seed, epoch)
        positions = permute(positions, int(dataset_len), key)
    out: list[int] = positions.tolist()
    return out


def _count_setting(value: Any, name: str) -> int:
    """``value`` as a plain int >= 0, else the ``ConfigError`` naming ``name``."""
    number = integer_setting(value, name)
    if number < 0:
        raise ConfigError(f"{name} must be >= 0, got {number}")
    return number


def _check_split(
    *,
    global_batch_size: int,
    world_size: int,
    rank: int,
    world_name: str = "`world_size`",
    rank_name: str = "`rank`",
) -> None:
    check_topology(
        canonical_replicas=global_batch_size,
        world_size=world_size,
        rank=rank,
        total_name="`global_batch_size`",
        total_hint="",
        world_name=world_name,
        rank_name=rank_name,
    )


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigError(f"environment variable {name} must be an integer >= 0, got {raw!r}")
    return value


def _topology(num_replicas: int | None, rank: int | None) -> tuple[int, int, str, str]:
    """(world size, rank, and where each came from): explicit, torch.distributed, env, default."""
    initialised = dist.is_available() and dist.is_initialized()
    world_name, rank_name = "`num_replicas`", "`rank`"
    if num_replicas is not None:
        num_replicas = integer_setting(num_replicas, world_name)
    if rank is not None:
        rank = integer_setting(rank, rank_name)
    if num_replicas is None:
        if initialised:
            num_replicas, world_name = dist.get_world_size(), "torch.distributed world size"
        else:
            num_replicas, world_name = _env_int("WORLD_SIZE", 1), "environment variable WORLD_SIZE"
    if rank is None:
        if initialised:
            rank, rank_name = dist.get_rank(), "torch.distributed rank"
        elif "RANK" in os.environ or num_replicas <= 1:
            rank, rank_name = _env_int("RANK", 0), "environment variable RANK"
        else:  # every process would take rank 0's indices: the data W times over
            raise ConfigError(
                f"the {world_name} is {num_replicas}, but nothing says this process's rank: "
                "pass `rank`, set RANK, or make the sampler once the process group exists "
                "(in Lightning, in `train_dataloader`)"
            )
    return num_replicas, rank, world_name, rank_name


class ElasticDistributedSampler(DistributedSampler[int]):
    """``DistributedSampler`` for map-style datasets with the same global batches for every W | G.

    Each step, rank r of W draws ``G/W`` indices (``rank_batch_size``): slice r of global batch
    b of the (seed, epoch) stream (see ``rank_indices``). Give the DataLoader
    ``batch_size=G // W``, or a divisor of it and accumulate gradients over the rest; a step is
    always one global batch. The tail is dropped (``drop_last``) or padded by wrapping around the
    same permutation, so every rank gets the same number of indices. It subclasses
    ``DistributedSampler`` so that frameworks which test for one (Lightning's
    ``use_distributed_sampler``) leave it alone instead of splitting each rank's share again.

    Args:
        dataset: A sized map-style dataset; its length is read once, here.
        num_replicas: World size W; defaults to torch.distributed, then ``WORLD_SIZE``, then 1.
        rank: This rank; defaults to torch.distributed, then ``RANK``, then 0 where W is 1
            (W > 1 with no rank from anywhere is a ConfigError).
        shuffle: Permute the indices per (seed, epoch); otherwise natural order.
        seed: Seed of the permutation, identical on every rank.
        drop_last: Drop the incomplete last global batch instead of padding it.
        global_batch_size: G, the samples of one step over all ranks; W must divide it.

    State:
        ``version``; ``epoch``; ``global_batches`` consumed in that epoch; and the settings
        compared on load: ``seed``, ``global_batch_size``, ``shuffle``, ``drop_last``,
        ``dataset_len``. W is not part of it: any W dividing G may load it.

    Resume guarantee: exact at step boundaries, onto any W dividing G, for any ``num_workers``.
    ``state_dict()`` with no argument counts the whole ``G/W`` shares this sampler has yielded,
    which is what was consumed with ``num_workers=0`` and under ``StatefulDataLoader`` (any
    ``num_workers``: it snapshots the sampler as each batch is sent, so prefetching does not
    leak into its state). A plain DataLoader with workers prefetches ahead, so pass the training
    loop's step count within the epoch as ``consumed_global_batches``. A state taken in the
    middle of a global batch (between accumulation micro-batches) resumes at its start.

    Epoch boundaries: a state at the end of epoch e (``global_batches`` is the epoch's total)
    is the point between epochs e and e+1, and the loop's ``set_epoch``, before or after the
    load, says which side the next pass starts on. ``set_epoch(e)``: the rest of epoch e, which
    is nothing, until ``set_epoch`` moves on. A later epoch: its first batch. No ``set_epoch``
    yet: epoch e+1 from its first batch, which is Lightning's order (it makes the loader's
    iterator, whose workers draw indices at once, before it calls ``set_epoch(e + 1)``). A pass
    that ran to the end by itself starts its epoch over at the next ``iter``, as
    ``DistributedSampler``'s does.

    A pass reads its epoch and start at its first index, so ``set_epoch`` or ``load_state_dict``
    between ``iter()`` and then applies; a DataLoader with workers draws that index as soon as
    its iterator exists, so call ``set_epoch`` before ``iter(loader)`` (and before
    ``state_dict()`` on a fresh StatefulDataLoader, which makes one). Only the newest pass
    draws: one made before a later ``iter``, or one that drew before a ``load_state_dict`` or a
    change of epoch, raises RuntimeError at its next index or at its end.
    """

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        *,
        global_batch_size: int,
    ) -> None:
        # Not DistributedSampler.__init__: it needs torch.distributed and splits differently.
        Sampler.__init__(self)
        global_batch_size = integer_setting(global_batch_size, "`global_batch_size`")
        world, this_rank, world_name, rank_name = _topology(num_replicas, rank)
        _check_split(
            global_batch_size=global_batch_size,
            world_size=world,
            rank=this_rank,
            world_name=world_name,
            rank_name=rank_name,
        )
        self.dataset = dataset  # type: ignore[assignment]  # any Sized, not only a Dataset
        self.num_replicas = world
        self.rank = this_rank
        # Plain ints and bools: a JSON state, and one permutation key per setting.
        self.shuffle = flag_setting(shuffle, "`shuffle`")
        self.seed = integer_setting(seed, "`seed`")
        self.drop_last = flag_setting(drop_last, "`drop_last`")
        self.global_batch_size = global_batch_size
        self.rank_batch_size = global_batch_size // world
        self.dataset_len = len(dataset)
        # DistributedSampler's attributes: a whole epoch's indices, this rank's and all ranks'.
        self.num_samples = self.num_global_batches() * self.rank_batch_size
        self.total_size = self.num_samples * world
        self.epoch = 0
        self._epoch_set = False  # the loop named ``epoch`` (set_epoch), not a default or a load
        self._start = 0  # global batch the next pass over ``epoch`` starts at
        self._consumed = 0  # whole global batches of ``epoch`` accounted for so far
        self._into_share = 0  # indices yielded into the current, unfinished share
        self._passes = 0  # iter() calls: only the newest pass may draw
        self._moves = 0  # set_epoch and load_state_dict calls that moved the position

    def num_global_batches(self) -> int:
        """Global batches (steps) in a whole epoch."""
        return num_global_batches(
            dataset_len=self.dataset_len,
            global_batch_size=self.global_batch_size,
            drop_last=self.drop_last,
        )

    def __len__(self) -> int:
        """This rank's indices in a whole epoch, as ``DistributedSampler`` counts them, also
        while a loaded state makes the pass begin later (it then yields fewer): loops that
        size an epoch by ``len`` and restore their own progress (Lightning) would otherwise
        count the skipped batches twice, ending the resumed epoch, and every later one, early."""
        return self.num_global_batches() * self.rank_batch_size

    def __iter__(self) -> Iterator[int]:
        # Until it draws, the newest pass's position is the state: a StatefulDataLoader snapshots
        # it when it makes an iterator, after an iterator it discarded may have prefetched.
        self._passes += 1
        self._consumed, self._into_share = self._start, 0
        return self._pass(self._passes)

    def _pass(self, number: int) -> Iterator[int]:
        self._check_newest(number, self._moves)
        total = self.num_global_batches()
        if self._start == total > 0 and not self._epoch_set:
            self.epoch, self._start = self.epoch + 1, 0  # a loaded end of epoch: see the class
        epoch, start, moves = self.epoch, self._start, self._moves
        self._consumed, self._into_share = start, 0
        step = max(1, _CHUNK_SAMPLES // self.rank_batch_size)
        for lo in range(start, total, step):
            for index in rank_indices(
                dataset_len=self.dataset_len,
                global_batch_size=self.global_batch_size,
                world_size=self.num_replicas,
                rank=self.rank,
                seed=self.seed,
                epoch=epoch,
                shuffle=self.shuffle,
                drop_last=self.drop_last,
                start_batch=lo,
                stop_batch=min(lo + step, total),
            ):
                self._check_newest(number, moves)
                self._into_share += 1
                if self._into_share == self.rank_batch_size:
                    self._consumed, self._into_share = self._consumed + 1, 0
                yield index
        # Here too: workers may have drawn every index before the loop's set_epoch came.
        self._check_newest(number, moves)
        if start < total:  # a pass that started at a loaded end keeps that epoch finished
            self._start = 0

    def _check_newest(self, number: int, moves: int) -> None:
        if number != self._passes or moves != self._moves:
            raise RuntimeError(
                "this iterator of the sampler is stale: the sampler was iterated again, loaded "
                "a state or changed epoch since it began; use the newest iter(sampler), and "
                "with DataLoader workers call set_epoch before the loader makes its iterator "
                "(under Lightning, which calls it after: checkpoint with every_n_train_steps, "
                "or use num_workers=0)"
            )

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch's permutation; a new epoch starts at its first global batch, and
        naming the epoch of a loaded end-of-epoch state keeps it finished."""
        epoch = _count_setting(epoch, "`epoch`")
        self._epoch_set = True
        if epoch != self.epoch:
            self.epoch, self._start, self._consumed, self._into_share = epoch, 0, 0, 0
            self._moves += 1

    def state_dict(self, consumed_global_batches: int | None = None) -> dict[str, Any]:
        """The resume point: ``consumed_global_batches`` of this epoch, else what was yielded."""
        total = self.num_global_batches()
        consumed = (
            self._consumed
            if consumed_global_batches is None
            else integer_setting(consumed_global_batches, "`consumed_global_batches`")
        )
        if not 0 <= consumed <= total:
            raise ConfigError(
                f"`consumed_global_batches` must be in [0, {total}] (the global batches of one "
                f"epoch), got {consumed}"
            )
        position = {"epoch": self.epoch, "global_batches": consumed}
        return {"version": _SAMPLER_STATE_VERSION, **position, **self._settings()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state``'s epoch and global batch; raise one error listing every mismatch.

        A state at the end of its epoch loaded into a sampler already set to a later epoch
        leaves that epoch alone: StatefulDataLoader applies the state at the next
        ``iter(loader)``, after the training loop's ``set_epoch(epoch + 1)``.
        """
        total = self.num_global_batches()
        live = {"version": _SAMPLER_STATE_VERSION} | self._settings()
        mismatches: dict[str, tuple[object, object]] = {
            key: (state.get(key), value) for key, value in live.items() if state.get(key) != value
        }
        epoch, consumed = _state_int(state.get("epoch")), _state_int(state.get("global_batches"))
        if epoch is None or epoch < 0:
            mismatches["epoch"] = (state.get("epoch"), "an integer >= 0")
        if consumed is None or not 0 <= consumed <= total:
            mismatches["global_batches"] = (
                state.get("global_batches"),
                f"an integer in [0, {total}]",
            )
        if mismatches or epoch is None or consumed is None:
            raise StateMismatchError(mismatches)
        if consumed == total and self.epoch > epoch:
            return
        self._epoch_set = self._epoch_set and self.epoch == epoch
        self.epoch, self._start, self._consumed, self._into_share = epoch, consumed, consumed, 0
        self._moves += 1

    def _settings(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "global_batch_size": self.global_batch_size,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "dataset_len": self.dataset_len,
        }


def _state_int(value: object) -> int | None:
    """A state's integer as a plain int (numpy too: a torch.save checkpoint keeps it), or None
    for anything else, a bool included."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    return None
