"""Check elastic determinism on a recipe: the same global batches for every configuration.

A recipe is a Python file defining ``pipeline() -> Pipeline`` (a complete recipe; topology is
set here). Ranks are simulated in one process: rank r of W is the recipe with
``options(world_size=W, rank=r)``, and the global batch of step t is the concatenation, in rank
order, of every rank's turn-t micro-batches. Each configuration's per-step global batches are
hashed (SHA-256 over input ids, positions and labels); the verdict compares them all with the
first.

The "standard loader" baseline is what most loaders do: a ``DistributedSampler`` over the same
documents for the live world size, each rank packing its own documents. Its batches depend on W.
How each configuration runs is ``_verify_runs``'s; the verdicts are ``_verdict``'s.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import torch

from zephon_torch._progress import progress, track
from zephon_torch._verdict import Run, failed_run, table, verdict
from zephon_torch._verify_runs import (
    Build,
    StepHashes,
    fault_run,
    fault_state,
    ranks_simulated,
    standard_batches,
    standard_run,
    zephon_batches,
    zephon_run,
)
from zephon_torch.elastic import supported_world_sizes
from zephon_torch.errors import ConfigError, ZephonError
from zephon_torch.ops._runner import RunnerKind
from zephon_torch.pipeline import Pipeline

__all__ = [
    "Build",
    "Comparison",
    "Run",
    "check_world_sizes",
    "compare",
    "fault_run",
    "fault_state",
    "load_recipe",
    "standard_batches",
    "standard_run",
    "table",
    "verdict",
    "verify",
    "with_runner",
    "zephon_batches",
    "zephon_run",
]


_LOADED: dict[str, str] = {}  # recipe module name -> the folder `load_recipe` put on sys.path


def load_recipe(path: str | Path) -> Build:
    """The ``pipeline`` function of a recipe file, imported as the module its file name names,
    its folder on ``sys.path``: spawned processes (DataLoader workers, the processes
    runner) import it by that name to unpickle its functions.

    Raises:
        ConfigError: the file is missing, not named as a module, fails to import (any error
            its code raises, a SyntaxError included) or defines no ``pipeline``."""
    file = Path(path).resolve()
    if not file.is_file():
        raise ConfigError(f"no recipe file {str(path)!r}")
    name = file.stem
    if not name.isidentifier():
        raise ConfigError(f"recipe {str(path)!r}: its file name must be a Python module name")
    folder = _LOADED.pop(name, None)
    if folder is not None:  # a recipe of that name loaded before: this one replaces it
        sys.modules.pop(name, None)
        if folder not in _LOADED.values():
            with contextlib.suppress(ValueError):
                sys.path.remove(folder)
    found = sys.modules.get(name) or importlib.util.find_spec(name)
    origin = getattr(found, "__file__", None) or getattr(found, "origin", None)
    if found is not None and origin != str(file):
        raise ConfigError(
            f"recipe {str(path)!r}: its file name is that of the module {name!r} "
            f"({origin}); rename the recipe"
        )
    spec = importlib.util.spec_from_file_location(name, str(file))
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot load recipe {str(path)!r}")
    if str(file.parent) not in sys.path:  # last: its other files shadow no module
        sys.path.append(str(file.parent))
        _LOADED[name] = str(file.parent)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as error:  # the recipe's own code: any error at import is the recipe's
        sys.modules.pop(name, None)
        raise ConfigError(
            f"recipe {str(path)!r}: cannot import: {type(error).__name__}: {error}"
        ) from error
    made = getattr(module, "pipeline", None)
    if not callable(made):
        raise ConfigError(f"recipe {str(path)!r} must define `pipeline() -> Pipeline`")

    def build() -> Pipeline:
        try:
            pipeline = made()
        except ZephonError:
            raise
        except Exception as error:  # the recipe's own code, as at import
            raise ConfigError(
                f"recipe {str(path)!r}: `pipeline()` raised {type(error).__name__}: {error}"
            ) from error
        if not isinstance(pipeline, Pipeline):
            raise ConfigError(
                f"recipe {str(path)!r}: `pipeline()` must return a Pipeline, got "
                f"{type(pipeline).__name__}"
            )
        return pipeline

    return build


@ranks_simulated()
def verify(
    build: Build,
    *,
    steps: int = 8,
    world_sizes: list[int] | None = None,
    workers: tuple[int, ...] = (0, 2),
    fault_step: int | None = None,
    standard: bool = True,
    runners: tuple[RunnerKind, ...] = ("processes",),
) -> list[Run]:
    """Every configuration's per-step global-batch hashes (see the module docstring).

    ``workers`` and ``runners`` add runs of the first world size (the smallest by default) with
    DataLoader workers, or with the per-document work on another runner (``"processes"``:
    spawned workers) than the recipe's. ``fault_step`` adds a resume from the last world size
    onto the first and one from the first, through a DataLoader's state, onto the last.

    Shows a progress bar over the configurations when stderr is a terminal."""
    if fault_step is not None and not 0 < fault_step < steps:
        raise ConfigError(f"`fault_step` must be in (0, steps={steps}), got {fault_step}")
    lanes = build()._options.canonical_replicas
    if world_sizes:
        check_world_sizes(world_sizes, lanes)
    sizes = world_sizes or [w for w in supported_world_sizes(canonical_replicas=lanes) if w <= 64]
    jobs: list[tuple[str, Callable[[], list[str]], bool]] = [
        (f"zephon W={w}", partial(zephon_run, build, w, steps), True) for w in sizes
    ]
    jobs += [
        (
            f"zephon W={sizes[0]} workers={n}",
            partial(zephon_run, build, sizes[0], steps, num_workers=n),
            True,
        )
        for n in workers
        if n
    ]
    jobs += [
        (
            f"zephon W={sizes[0]} runner={runner}",
            partial(zephon_run, with_runner(build, runner), sizes[0], steps),
            True,
        )
        for runner in runners
    ]
    if fault_step is not None:
        # from the last world size to the first (by default the most ranks to the fewest; the
        # same, with one world size), and back through a DataLoader's state, with workers where
        # any are asked for
        jobs.append(
            (
                f"zephon W={sizes[-1]} fault@{fault_step} -> W={sizes[0]}",
                partial(fault_run, build, sizes[-1], sizes[0], fault_step, steps),
                True,
            )
        )
        n = max(workers, default=0)
        jobs.append(
            (
                f"zephon W={sizes[0]} loader workers={n} fault@{fault_step} -> W={sizes[-1]}",
                partial(fault_run, build, sizes[0], sizes[-1], fault_step, steps, loader_workers=n),
                True,
            )
        )
    if standard:
        jobs += [(f"standard W={w}", partial(standard_run, build, w, steps), False) for w in sizes]
    return _run_jobs(jobs)


def check_world_sizes(world_sizes: list[int], canonical_replicas: int) -> None:
    """Raise ``ConfigError`` naming every world size that does not divide
    ``canonical_replicas`` (such a configuration cannot run at all)."""
    supported = supported_world_sizes(canonical_replicas=canonical_replicas)
    unsupported = [w for w in world_sizes if w not in supported]
    if unsupported:
        raise ConfigError(
            f"`world_sizes` must divide canonical_replicas={canonical_replicas} (supported: "
            f"{supported}), got {unsupported}"
        )


def with_runner(build: Build, runner: RunnerKind) -> Build:
    """The recipe with its per-document work on ``runner`` (a performance knob)."""

    def make() -> Pipeline:
        pipeline = build()
        if pipeline._tokenize is not None:
            return pipeline._with(_tokenize=replace(pipeline._tokenize, runner=runner))
        assert pipeline._pretokenized is not None
        return pipeline._with(_pretokenized=replace(pipeline._pretokenized, runner=runner))

    return make


def _run_jobs(jobs: list[tuple[str, Callable[[], list[str]], bool]]) -> list[Run]:
    """Each job's run. The first is the reference: its error is the recipe's, raised. A later
    one that fails is a run that failed to run (an error of setup, see
    ``_verdict.is_setup_error``) or that diverges (a resume of a recipe that is not
    deterministic may fail), with its error."""
    runs = []
    with progress(len(jobs), "verify") as bar:
        for name, job, zephon in jobs:
            bar.note(name)
            try:
                hashes = job()
                runs.append(Run(name, hashes, zephon=zephon, parts=getattr(hashes, "parts", None)))
            except Exception as error:
                if not runs:
                    raise
                runs.append(failed_run(name, error, zephon=zephon))
            bar.update()
    return runs


@dataclass
class Comparison:
    """The configurations of the picture and, with training, their loss curves.

    Attributes:
        runs: per configuration the hashes of its global batches (zephon ones first; the
            first is the reference).
        losses: per run name the training loss of each step (empty without training).
        fault_step: the step after which the resumed runs continue on another world size;
            0: no fault, the other world sizes run from the start.
        note: why the world sizes differ from the default 16 -> 8/32/64, if they do.
    """

    runs: list[Run]
    losses: dict[str, list[float]]
    fault_step: int
    note: str | None = None


@ranks_simulated()
def compare(
    build: Build,
    *,
    steps: int,
    fault_step: int,
    world_sizes: list[int] | None = None,
    train: bool = False,
    train_seconds: float = 120.0,
) -> Comparison:
    """What ``verify --plot`` draws: a reference run on W ranks, runs that save at
    ``fault_step`` and resume on other world sizes (with ``fault_step=0``, runs on them from
    the start), and the standard loader on each.

    ``world_sizes`` is ``[reference, *others]``; by default 16 then 8, 32 and 64, or the
    divisors of L available (see ``_plot.plot_world_sizes``). The resumed runs share the
    reference's first ``fault_step`` steps: those are the same 16-rank computation. With
    ``train``, a tiny model is trained on every configuration's global batches (see
    ``_plot.train_losses``), at most ``train_seconds`` each. A configuration other than the
    reference that fails is a run with its error, as for ``verify``.
    """
    from zephon_torch._plot import plot_world_sizes, train_losses, training_pair

    if not 0 <= fault_step < steps:
        raise ConfigError(
            f"`fault_step` must be in [0, steps={steps}) (0: no fault), got {fault_step}"
        )
    lanes = build()._options.canonical_replicas
    note = None
    if world_sizes is None:
        reference, others, note = plot_world_sizes(lanes)
    else:
        check_world_sizes(world_sizes, lanes)
        reference, *others = world_sizes
    batches: dict[str, list[list[dict[str, torch.Tensor]]]] = {}
    runs: list[Run] = []
    with progress(2 + 2 * len(others), "verify --plot") as bar:
        name = f"zephon W={reference}"
        bar.note(name)
        head = batches[name] = zephon_batches(build, reference, steps)
        hashes = StepHashes(head)
        runs.append(Run(name, list(hashes), parts=hashes.parts))
        state = None
        if fault_step:
            bar.note(f"state at step {fault_step} on W={reference}")
            state = fault_state(build, reference, fault_step)
        bar.update()
        for w in others:
            name = f"zephon W={reference} fault@{fault_step} -> W={w}" if state else f"zephon W={w}"
            bar.note(name)
            resumed = partial(zephon_batches, build, w, steps, start=state, first_step=fault_step)
            runs.append(_drawn(name, resumed, batches, zephon=True, head=head[:fault_step]))
            bar.update()
        for w in [reference, *others]:
            name = f"standard W={w}"
            bar.note(name)
            standard = partial(standard_batches, build, w, steps)
            runs.append(_drawn(name, standard, batches, zephon=False))
            bar.update()
    losses: dict[str, list[float]] = {}
    if train:
        for run in track(runs, "training the tiny model"):
            pairs = [training_pair(parts) for parts in batches[run.name]]
            losses[run.name] = train_losses(pairs, max_seconds=train_seconds)
    return Comparison(runs, losses, fault_step, note)


def _drawn(
    name: str,
    make: Callable[[], list[list[dict[str, torch.Tensor]]]],
    batches: dict[str, list[list[dict[str, torch.Tensor]]]],
    *,
    zephon: bool,
    head: list[list[dict[str, torch.Tensor]]] | None = None,
) -> Run:
    """The run of one configuration of the picture (``head``, then what ``make`` gives), its
    batches kept in ``batches``; one that fails is a run with its error (it diverges, or
    failed to run), drawn without a curve."""
    try:
        batches[name] = (head or []) + make()
    except Exception as error:
        batches[name] = []
        return failed_run(name, error, zephon=zephon)
    hashes = StepHashes(batches[name])
    return Run(name, list(hashes), zephon=zephon, parts=hashes.parts)
