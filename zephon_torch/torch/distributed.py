"""Where this process sits: rank and world size, and the loader's collectives: the all-gather
that makes states global, and the all-reduce that ends a `stop` stream on every rank at once.

Rank and world size come from ``torch.distributed`` when it is initialised, else from the
``RANK``/``WORLD_SIZE`` environment (as torchrun sets them), else from explicit options, else a
single rank. An explicit option that contradicts the live process group is an error, and so is
a malformed environment value: silently training on the wrong lanes is the failure to avoid.
"""

from __future__ import annotations

import collections
import datetime
import json
import os
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from zephon_torch._state import check_ranks_in_step
from zephon_torch.errors import ConfigError, StateMismatchError, ZephonError


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name} must be an integer, got {raw!r}") from None
    if value < 0:
        raise ConfigError(f"environment variable {name} must be >= 0, got {value}")
    return value


def distributed_ready() -> bool:
    """Whether a default process group is initialised."""
    return dist.is_available() and dist.is_initialized()


def resolve_topology(*, world_size: int | None, rank: int | None) -> tuple[int, int]:
    """``(world_size, rank)`` from the process group, the environment, or the options given.

    Options that differ from the process group's (or the environment's) world name a
    data-parallel world inside it, as under tensor, pipeline or context parallelism: their
    `world_size` must divide its size, and `rank` (the data-parallel rank) be given, but for a
    `world_size` of 1 (a loader of this process alone, rank 0 evaluating, say).
    """
    if distributed_ready():
        found, source = (dist.get_world_size(), dist.get_rank()), "torch.distributed"
    else:
        env = (_env_int("WORLD_SIZE"), _env_int("RANK"))
        if (env[0] is None) != (env[1] is None):
            launcher = (  # Lightning's DDP sets them so in the processes it starts
                " (a launcher such as Lightning's DDP sets WORLD_SIZE and LOCAL_RANK before its "
                "process group exists: ask for the pipeline's lanes in the fit; "
                "accumulate_grad_batches for a global step is canonical_replicas // devices)"
                if env[1] is None and "LOCAL_RANK" in os.environ
                else ""
            )
            raise ConfigError(
                f"environment sets only one of WORLD_SIZE={os.environ.get('WORLD_SIZE')!r} and "
                f"RANK={os.environ.get('RANK')!r}; set both or neither{launcher}"
            )
        if env[0] is None or env[1] is None:
            return _from_options(world_size, rank)
        found, source = (env[0], env[1]), "the RANK/WORLD_SIZE environment"
        if found[1] >= found[0]:
            raise ConfigError(f"RANK={found[1]} must be below WORLD_SIZE={found[0]}")
    if world_size is not None and world_size != found[0]:
        return _data_parallel(world_size, rank, found[0], source)
    for name, given, live in (("world_size", world_size, found[0]), ("rank", rank, found[1])):
        if given is not None and given != live:
            raise ConfigError(f"`{name}` option is {given}, but {source} says {live}")
    return found


def world_size_name(world_size: int | None) -> str:
    """How an error names the world size `resolve_topology` gives for the `world_size`
    option given: by where it came from."""
    if world_size is not None:
        return "`world_size`"
    if distributed_ready():
        return "the process group's world size"
    if _env_int("WORLD_SIZE") is not None:
        return "the environment's WORLD_SIZE"
    return "`world_size`"


def _from_options(world_size: int | None, rank: int | None) -> tuple[int, int]:
    """The topology of the options alone, where no process group or environment tells one:
    both given, or neither (this process alone). One without the other is refused: every
    process of a job launched without RANK (``mp.spawn``, a SLURM script) would else read
    rank 0's lanes, and the rest of the data none."""
    if world_size is not None and world_size > 1 and rank is None:
        raise ConfigError(
            f"`world_size` option is {world_size}, but no `rank` is given, and neither "
            "torch.distributed nor the RANK/WORLD_SIZE environment tells this process's: give "
            "`rank` too (each process would else read rank 0's lanes)"
        )
    if world_size is None and rank:
        raise ConfigError(
            f"`rank` option is {rank}, but no `world_size` is given, and neither "
            "torch.distributed nor the RANK/WORLD_SIZE environment tells one: give "
            "`world_size` too"
        )
    return (1 if world_size is None else world_size, 0 if rank is None else rank)


def _data_parallel(world_size: int, rank: int | None, live: int, source: str) -> tuple[int, int]:
    """A data-parallel world of `world_size` inside the `live` processes (see
    `resolve_topology`), checked."""
    if world_size < 1 or live % world_size or (rank is None and world_size != 1):
        raise ConfigError(
            f"`world_size` option is {world_size}, but {source} says {live}: a data-parallel "
            "world inside it (tensor, pipeline or context parallelism) must divide it, and "
            "`rank` give this process's data-parallel rank"
        )
    rank = 0 if rank is None else rank
    if not 0 <= rank < world_size:
        raise ConfigError(f"`rank` option is {rank}, not below `world_size` {world_size}")
    return world_size, rank


def collective(topology: tuple[int, int]) -> bool:
    """Whether a loader of this (data-parallel) `topology` takes part in collectives: there
    is a process group of several processes, and the topology is not this process's alone."""
    return topology[0] > 1 and distributed_ready() and dist.get_world_size() > 1


def check_data_parallel(topology: tuple[int, int], recipe: dict[str, Any]) -> None:
    """Gathers every process's `(world_size, rank)` and `recipe` (see
    `all_gather_lane_states`) and checks them (see `_check_topologies` and
    `check_same_recipe`): a collective, at a loader's iteration, so a wrong rank or ranks
    running different recipes fail at step 0, on every rank, not at the first state taken
    after training on mixed data."""
    if not collective(topology):
        return
    gathered = _gathered(
        "iterating",
        topology,
        recipe,
        failing="the loader's check of the {ranks} ranks' topology failed (every rank "
        "iterates its loader; the timeout is {timeout})",
    )
    _check_topologies([part[0] for part in gathered])
    check_same_recipe([part[1] for part in gathered])


def _gathered(call: str, *payload: Any, failing: str) -> list[tuple[Any, ...]]:
    """Every process's `payload` (by process rank) from the loader's `call`, gathered on the
    loader's group; a `ZephonError` saying `failing` (its `{ranks}` and `{timeout}` filled
    in) where the gather fails, and one naming the calls where processes made different
    ones (see `_check_same_call`)."""
    gathered: list[Any] = [None] * dist.get_world_size()
    group = loader_group()
    try:
        dist.all_gather_object(gathered, (call, *payload), group=group)
    except RuntimeError as error:  # torch's DistBackendError, a timeout or a lost peer
        said = failing.format(ranks=len(gathered), timeout=_timeout(dist.group.WORLD))
        raise ZephonError(f"{said}: {type(error).__name__}: {error}") from error
    _check_same_call(gathered, call)
    return [part[1:] for part in gathered]


def _check_topologies(topologies: list[tuple[int, int]]) -> None:
    """``ConfigError`` unless the processes' `(world_size, rank)` (by process rank) name one
    world, each of its ranks held by some process: where they differ from the processes'
    (a data-parallel world), the processes of one rank are its replicas (tensor, pipeline or
    context parallel peers) and get the same batches."""
    sizes = sorted({size for size, _ in topologies})
    if len(sizes) > 1:
        shown = _listed(f"process {i}: {size}" for i, (size, _) in enumerate(topologies))
        raise ConfigError(f"the processes give different `world_size` options ({shown})")
    held = collections.Counter(rank for _, rank in topologies)
    missing = [rank for rank in range(sizes[0]) if rank not in held]
    replicas = len(topologies) // sizes[0]
    uneven = sorted(rank for rank, count in held.items() if count != replicas)
    if missing or uneven:
        shown = _listed(f"process {i}: {rank}" for i, (_, rank) in enumerate(topologies))
        what = (
            f"no process holds data-parallel rank(s) {missing} of {sizes[0]}: their lanes "
            "would be trained on by none"
            if missing
            else f"data-parallel rank(s) {uneven} are not held by {replicas} processes each, "
            "as every rank's replicas are: a process with another's rank trains on its data"
        )
        raise ConfigError(f"{what} ({shown}); give each process its data-parallel rank as `rank`")


def _check_same_call(gathered: list[Any], mine: str) -> None:
    """``ZephonError`` unless every process's gathered part (by process rank) came from the
    same loader call as this one's, ``mine``: ranks that iterate and take states in different
    orders pair one's topology with another's state."""
    calls = [part[0] if isinstance(part, tuple) and part else None for part in gathered]
    if any(call != mine for call in calls):
        shown = _listed(f"process {i}: {call}" for i, call in enumerate(calls))
        raise ZephonError(
            f"the processes made different loader calls at once ({shown}): every process "
            "iterates its loader and takes its state at the same points, in the same order"
        )


def _listed(items: Iterable[str]) -> str:
    """The first `_SHOWN` items, comma-separated, and how many more."""
    shown = list(items)
    more = f" (and {len(shown) - _SHOWN} more)" if len(shown) > _SHOWN else ""
    return ", ".join(shown[:_SHOWN]) + more


def all_gather_lane_states(
    lanes: dict[str, Any], recipe: dict[str, Any], topology: tuple[int, int]
) -> dict[str, Any]:
    """Every rank's lane states merged, on every rank (a collective: call it on all ranks).

    ``recipe`` (the fingerprint and token estimation) is gathered too: ranks whose recipes
    differ (another seed, mixture or packing on one of them) give other global batches than
    one process would, and their lanes would make one state of two recipes. ``topology``:
    this process's data-parallel `(world_size, rank)`; processes of one rank (replicas) must
    hold the same states, and a world of 1 gathers nothing.

    Raises:
        ConfigError: on every rank, naming the settings and the ranks that differ from rank 0,
            or the processes' topologies that name no one world (see `_check_topologies`).
        StateMismatchError: on every rank, when the ranks' lanes are at different turns
            (ranks that loaded states of different steps), or replicas' lanes differ.
    """
    if not collective(topology):
        return dict(lanes)
    gathered = _gathered(
        "state_dict",
        recipe,
        topology,
        lanes,
        failing="gathering the loader's state from the {ranks} ranks failed. The state is a "
        "collective: every rank calls state_dict() at the same step (a call inside "
        "`if rank == 0:` waits for the other ranks until the process group's timeout, "
        "{timeout}, then fails here)",
    )
    check_same_recipe([part[0] for part in gathered])
    _check_topologies([part[1] for part in gathered])
    merged = _merge_replicas([part[2] for part in gathered])
    check_ranks_in_step(
        merged, canonical_replicas=recipe["canonical_replicas"], world_size=topology[0]
    )
    return merged


def _merge_replicas(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The processes' lane states (by process rank) as one, in lane order; a lane several
    processes hold (replicas of one data-parallel rank) must be at one state on all."""
    merged: dict[str, Any] = {}
    holder: dict[str, int] = {}
    for process, part in enumerate(parts):
        for lane, state in part.items():
            if lane in merged and not _equal(merged[lane], state):
                raise StateMismatchError(
                    {
                        f"lane {lane}": (
                            f"process {holder[lane]}'s state differs from process {process}'s: "
                            "replicas of one data-parallel rank gave different batches",
                            "one state on every process holding the lane",
                        )
                    }
                )
            merged.setdefault(lane, state)
            holder.setdefault(lane, process)
    return dict(sorted(merged.items(), key=lambda kv: int(kv[0])))


# (the default group, the loader group made for it, or the error that making it raised), the
# groups held weakly: `destroy_process_group()` frees the loader group with the default one.
# Held on here past that, it lived until the interpreter's exit, and on a process that had
# abandoned a collective on it its gloo threads were torn down from there with an abort
# ("terminate called without an active exception") in about 1 exit in 20.
_GROUPS: list[tuple[weakref.ref[Any], weakref.ref[Any] | ZephonError]] = []


def loader_group() -> Any:
    """A gloo group of every rank, for the loader's own collectives; made the first time it is
    asked for under the current default group (then a collective: every rank asks at the same
    point of the program, as every rank takes a state or iterates), kept after.

    Not the default group: the loader's collectives carry CPU tensors and pickled states. On an
    NCCL group a CPU all-reduce is refused, and `all_gather_object` moves each state through
    the GPU `torch.cuda.current_device()` names, waiting there behind the training's queued
    work. And on the default group a rank that skips a call (`state_dict()` inside
    `if rank == 0:`) pairs with another rank's next training collective. Its timeout is the
    default group's (`init_process_group(timeout=...)`).
    """
    world = dist.group.WORLD
    for made_for, held in _GROUPS:
        if made_for() is world:
            if isinstance(held, ZephonError):  # torch's count of groups is out of step now:
                raise held  # a group made again would pair with others' next ones
            group = held()
            if group is not None:
                return group
    try:
        group = dist.new_group(backend="gloo", timeout=_timeout(world))
    except RuntimeError as error:
        failed = ZephonError(
            f"setting up the loader's gloo group of the {dist.get_world_size()} processes "
            "failed. Every process sets it up at its loader's first iteration or state: a "
            "process that did not get there (a loader iterated, or a state taken, on rank 0 "
            "alone: give such a loader `options(world_size=1)`) leaves the others waiting "
            "until the timeout; else gloo could not connect (it finds its network interface "
            f"from the host name, or GLOO_SOCKET_IFNAME): {type(error).__name__}: {error}"
        )
        _GROUPS[:] = [(weakref.ref(world), failed)]
        raise failed from error
    _GROUPS[:] = [(weakref.ref(world), weakref.ref(group))]  # one default group's at a time
    return group


def _timeout(group: Any) -> datetime.timedelta:
    """`group`'s timeout: its CPU backend's, else its CUDA backend's (torch tells it only
    there), else torch's default."""
    for device in ("cpu", "cuda"):
        try:
            timeout = group._get_backend(torch.device(device)).options._timeout
        except Exception:  # no such backend, or another torch: the default
            continue
        if isinstance(timeout, datetime.timedelta):
            return timeout
    return dist.default_pg_timeout


def check_same_recipe(recipes: list[dict[str, Any]]) -> None:
    """``ConfigError`` unless every rank's recipe (by rank) equals rank 0's."""
    first = recipes[0]
    differences = []
    for rank, recipe in enumerate(recipes[1:], start=1):
        keys = sorted(
            k for k in set(first) | set(recipe) if not _equal(first.get(k), recipe.get(k))
        )
        differences += [
            f"{key}: {first.get(key)!r} on rank 0, {recipe.get(key)!r} on rank {rank}"
            for key in keys
        ]
    if differences:
        shown = "; ".join(differences[:_SHOWN])
        more = f" (and {len(differences) - _SHOWN} more)" if len(differences) > _SHOWN else ""
        raise ConfigError(
            "the ranks run different recipes, so the global batches are not one process's "
            f"and no state of them could resume: {shown}{more}"
        )


_SHOWN = 6  # differences named in the error


def _equal(a: Any, b: Any) -> bool:
    """Equal, or equal as JSON (a NaN figure is not equal to itself)."""
    return bool(a == b) or json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def equal_ending(
    items: Iterator[dict[str, Any]],
    *,
    lanes_per_turn: int,
    tokens: Callable[[dict[str, Any]], int],
    begun: int = 0,
    ended: Callable[[list[dict[str, Any]]], object] | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield a rank's ``items`` turn by turn (``lanes_per_turn`` each) until a turn in which no
    rank has data.

    The rank's stream must not end by itself: spent lanes pad on, each padding batch with its
    lane's state. Before yielding a turn, one all-reduce tells whether any rank's turn holds a
    token (``tokens(item)``), so a rank whose lanes are spent yields padding until every rank
    is spent: every rank ends on the same step, the global stream equals the one-process
    stream, padding included, and every lane's state keeps pace.

    ``begun``: the rank's lanes that delivered their batch of its first turn already (it
    stopped mid-step, and so did every rank). The rest of that turn comes first, with no
    all-reduce: a turn begun held data, as the one-process stream would have cut it else.

    ``ended`` is given the rank's items of the turn that no rank has data in (not yielded):
    each lane's spent state, as `_turn_order.cut_at_empty_turn` gives one process's.
    """
    group = loader_group()
    for _ in range(lanes_per_turn - begun if begun else 0):
        yield next(items)
    while True:
        turn = [next(items) for _ in range(lanes_per_turn)]
        # on the CPU whatever default device the script set: a GPU flag would wait for the
        # training's queued work at every step
        flag = torch.tensor([int(any(tokens(item) > 0 for item in turn))], device="cpu")
        try:
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
        except RuntimeError as error:
            raise ZephonError(
                "the loader's all-reduce that ends the stream on every rank at one step "
                "failed (every rank iterates its loader in step; a rank stopped, or lost): "
                f"{type(error).__name__}: {error}"
            ) from error
        if int(flag.item()) == 0:
            if ended is not None:
                ended(turn)
            return
        yield from turn
