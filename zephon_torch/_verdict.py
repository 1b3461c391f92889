"""What ``verify`` concludes: each configuration's verdict, the table and the overall verdict.

A configuration is IDENTICAL to the reference (the same hash at every step, as many steps) or
DIVERGES (another hash, another number of steps, or an error while running, as the resume of a
recipe that is not deterministic gives); it FAILED TO RUN when it could not start for a reason of
setup (a ``ConfigError``, a missing module, a function that cannot be pickled for spawned
workers) or met an error of the machine or the storage (an ``OSError``, a ``MemoryError``),
which says nothing of determinism. A standard-loader run that gave fewer steps than
the reference is "not compared" past them. The overall verdict and exit code: DIVERGES (1) when
any zephon_torch configuration diverges, else INCOMPLETE (3) when one failed to run, none gave a
step to compare or only the reference ran, else IDENTICAL (0); errors of the settings exit with
2 before any verdict.
"""

from __future__ import annotations

from dataclasses import dataclass

from zephon_torch.errors import ConfigError, cannot_pickle

EXIT_IDENTICAL = 0
EXIT_DIVERGES = 1
EXIT_INCOMPLETE = 3


@dataclass
class Run:
    """One configuration and the SHA-256 of each of its global batches.

    ``error`` says why the configuration failed (then it has no hashes); ``setup`` is True
    when it failed to run at all (see ``is_setup_error``) rather than diverged."""

    name: str
    hashes: list[str]
    zephon: bool = True
    error: str | None = None
    setup: bool = False
    # per step, the SHA-256 of each micro-batch of the global batch (lane order), where known
    parts: list[list[str]] | None = None


def failed_run(name: str, error: BaseException, *, zephon: bool = True) -> Run:
    """The run of a configuration that raised ``error``: failed to run, or diverged."""
    why = f"{type(error).__name__}: {error}".splitlines()[0]
    return Run(name, [], zephon=zephon, error=why, setup=is_setup_error(error))


def is_setup_error(error: BaseException) -> bool:
    """True for an error that keeps a configuration from running at all, or that the machine
    or the storage raised: a ``ConfigError``, an ``ImportError``, a function or object that
    cannot be pickled for spawned processes, an ``OSError`` (``StorageError`` is one: no
    descriptor left, a full disk, storage down) or a ``MemoryError`` (the error or one of its
    causes). None of them says anything of determinism."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ConfigError | ImportError | OSError | MemoryError):
            return True
        if cannot_pickle(current):  # a lambda or a closure for spawned processes
            return True
        current = current.__cause__
    return False


def verdict(run: Run, reference: Run, *, steps: int | None = None) -> str:
    """IDENTICAL, where the run first diverges from the reference, or that it failed to run.

    ``steps``, for a standard-loader run, is the number of steps of the zephon_torch reference:
    steps the baseline did not give are not compared, and do not read as IDENTICAL."""
    if run.error is not None:
        if run.setup:
            return f"FAILED TO RUN: {run.error}"
        return f"DIVERGES: the run failed: {run.error}"
    for t, (a, b) in enumerate(zip(run.hashes, reference.hashes)):
        if a != b:
            return f"DIVERGES from {reference.name} at step {t}{_first_lane(run, reference, t)}"
    compared = min(len(run.hashes), len(reference.hashes))
    if steps is not None and compared < steps:
        short = f"the standard loader gave {len(run.hashes)} of {steps} steps"
        if len(reference.hashes) != len(run.hashes):
            short += f" ({len(reference.hashes)} on {reference.name})"
        if not compared:
            return f"not compared (0 steps): {short}"
        return f"not compared past step {compared} (the steps before agree): {short}"
    if len(run.hashes) != len(reference.hashes):
        return f"DIVERGES: {len(run.hashes)} steps vs {len(reference.hashes)}"
    return f"IDENTICAL to {reference.name} ({len(run.hashes)} steps)"


def _first_lane(run: Run, reference: Run, step: int) -> str:
    """`` (lane i first)``: the first micro-batch of global batch ``step`` that differs, where
    both runs hashed each (zephon_torch runs: micro-batch i is lane i's); else nothing."""
    if run.parts is None or reference.parts is None or not run.zephon:
        return ""
    if step >= min(len(run.parts), len(reference.parts)):
        return ""
    mine, theirs = run.parts[step], reference.parts[step]
    if len(mine) != len(theirs):
        return f" ({len(mine)} micro-batches vs {len(theirs)})"
    lane = next(i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b)
    return f" (lane {lane} first)"


def table(runs: list[Run]) -> str:
    """Per-step hashes (first 10 hex digits) per configuration, and the verdicts."""
    reference = next(r for r in runs if r.zephon)
    steps = max(len(r.hashes) for r in runs)
    lines = ["step  " + "  ".join(f"{r.name[:28]:28s}" for r in runs)]
    for t in range(steps):
        cells = []
        for r in runs:
            h = r.hashes[t][:10] if t < len(r.hashes) else "-"
            mark = (
                " "
                if t < len(r.hashes)
                and t < len(reference.hashes)
                and r.hashes[t] == reference.hashes[t]
                else "*"
            )
            cells.append(f"{h + mark:28s}")
        lines.append(f"{t:4d}  " + "  ".join(cells))
    lines.append("")
    standard = [r for r in runs if not r.zephon]
    for r in runs:
        if r is reference and r.error is None:
            lines.append(f"{r.name}: the reference ({len(r.hashes)} steps)")
        elif r.zephon or not standard:
            lines.append(f"{r.name}: {verdict(r, reference)}")
        else:
            said = verdict(r, standard[0], steps=len(reference.hashes))
            if r is standard[0] and said.startswith("IDENTICAL"):  # compared with itself
                said = f"the standard loader's reference ({len(r.hashes)} steps)"
            lines.append(f"{r.name}: {said}")
    return "\n".join(lines)


def overall(runs: list[Run]) -> tuple[str, int]:
    """The verdict over the zephon_torch configurations and its exit code (module docstring)."""
    zephon = [r for r in runs if r.zephon]
    failed = [r for r in zephon if r.setup]
    ran = [r for r in zephon if not r.setup]
    if any(r.error is not None or r.hashes != ran[0].hashes for r in ran):
        return "zephon_torch DIVERGES across configurations", EXIT_DIVERGES
    if ran and not ran[0].hashes:
        return (
            "INCOMPLETE: the configurations gave no step to compare (the recipe gave no data)",
            EXIT_INCOMPLETE,
        )
    if len(zephon) == 1:
        return (
            "INCOMPLETE: only the reference ran, so nothing was compared with it; ask for "
            "another world size, worker count, runner or fault step",
            EXIT_INCOMPLETE,
        )
    if failed:
        return (
            f"INCOMPLETE: {len(failed)} of {len(zephon)} configurations failed to run (the "
            f"other {len(ran)} are IDENTICAL); fix their setup and run verify again",
            EXIT_INCOMPLETE,
        )
    return "zephon_torch IDENTICAL across configurations", EXIT_IDENTICAL
