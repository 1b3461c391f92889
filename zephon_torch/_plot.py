"""The picture of ``verify --plot``: batch fingerprints per step and, optionally, loss curves.

Each global batch's SHA-256 becomes a number in [0, 1) (its first 12 hex digits), so identical
batches draw one curve and any difference jumps. The optional tiny model (token ids hashed into
a 512-entry vocabulary, a 32-wide embedding and a linear next-token head, plain SGD) trains in
seconds on CPU on each batch's labels (their -100 positions, padding and masked document
boundaries, left out of the loss; the next token where a run gives no labels); identical
batches give bit-identical loss curves. matplotlib is imported only
here, only when drawing, with the Agg backend (no display needed).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from zephon_torch._verdict import EXIT_DIVERGES, EXIT_IDENTICAL, EXIT_INCOMPLETE, Run, overall
from zephon_torch.elastic import supported_world_sizes
from zephon_torch.errors import ConfigError

if TYPE_CHECKING:
    from zephon_torch.verify import Comparison

__all__ = [
    "fingerprint_value",
    "panel_titles",
    "plot_world_sizes",
    "render",
    "token_ids",
    "train_losses",
    "training_pair",
]

REFERENCE = 16
OTHERS = (8, 32, 64)
VOCAB = 512
DIM = 32
IGNORED = -100  # a label the loss leaves out


def fingerprint_value(digest: str) -> float:
    """A SHA-256 hex digest as a number in [0, 1): its first 12 hex digits over 16**12."""
    return int(digest[:12], 16) / 16**12


def plot_world_sizes(canonical_replicas: int) -> tuple[int, list[int], str | None]:
    """``(reference, others, note)``: 16 then 8, 32 and 64 when they all divide L; otherwise
    the divisor of L nearest 16 as reference and up to three other divisors, with a note."""
    sizes = [w for w in supported_world_sizes(canonical_replicas=canonical_replicas) if w <= 64]
    if REFERENCE in sizes and all(w in sizes for w in OTHERS):
        return REFERENCE, list(OTHERS), None
    if len(sizes) < 2:
        raise ConfigError(
            f"`canonical_replicas` must have at least two divisors to compare world sizes, "
            f"got {canonical_replicas}"
        )
    reference = min(sizes, key=lambda w: (abs(w - REFERENCE), -w))
    rest = [w for w in sizes if w != reference]
    # Spread the picks over the divisors: the largest, the smallest, then the middle.
    picks = sorted({rest[-1], rest[0], rest[len(rest) // 2]})
    note = (
        f"canonical_replicas={canonical_replicas} does not allow 16 -> 8/32/64 ranks; "
        f"using {reference} -> {'/'.join(map(str, picks))}"
    )
    return reference, picks, note


def token_ids(parts: list[dict[str, torch.Tensor]]) -> torch.Tensor:
    """One global batch's token ids as a ``(rows, width)`` tensor, hashed into ``VOCAB``."""
    return torch.cat([p["input_ids"] for p in parts]).remainder(VOCAB)


def training_pair(parts: list[dict[str, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """One global batch as the tiny model's ``(inputs, targets)``, both hashed into ``VOCAB``:
    the targets are the batch's labels (-100 kept), or, where its parts carry none (the
    standard loader's), each row's next token with the last position left out."""
    ids = token_ids(parts)
    if all("labels" in p for p in parts):
        labels = torch.cat([p["labels"] for p in parts])
        return ids, torch.where(labels == IGNORED, IGNORED, labels.remainder(VOCAB))
    targets = torch.full_like(ids, IGNORED)
    targets[:, :-1] = ids[:, 1:]
    return ids, targets


def train_losses(
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    *,
    lr: float = 10.0,
    seed: int = 0,
    max_seconds: float = 120.0,
) -> list[float]:
    """Train the tiny next-token model on ``batches`` of ``(inputs, targets)`` (one SGD step
    each, the same start for every call; targets of -100 left out) and return the loss of each
    step; stops early after ``max_seconds``."""
    generator = torch.Generator().manual_seed(seed)
    embed = torch.nn.Parameter(torch.randn(VOCAB, DIM, generator=generator) * 0.1)
    head = torch.nn.Parameter(torch.randn(DIM, VOCAB, generator=generator) * 0.1)
    optimizer = torch.optim.SGD([embed, head], lr=lr)
    losses = []
    deadline = time.perf_counter() + max_seconds
    for ids, targets in batches:
        logits = embed[ids] @ head
        counted = int((targets != IGNORED).sum())  # none: a batch of padding, no step taken
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, VOCAB), targets.reshape(-1), ignore_index=IGNORED, reduction="sum"
        ) / max(counted, 1)
        optimizer.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        losses.append(float(loss.detach()))
        if time.perf_counter() > deadline:
            break
    return losses


def panel_titles(runs: list[Run]) -> tuple[str, str]:
    """The titles of the zephon_torch panel and the standard-loader panel, from the verdicts:
    curves that coincide are said to only when they do."""
    summary, code = overall(runs)
    zephon = {
        EXIT_IDENTICAL: "zephon_torch: curves coincide",
        EXIT_DIVERGES: "zephon_torch: DIVERGES (see the verdicts)",
        EXIT_INCOMPLETE: "zephon_torch: INCOMPLETE (a configuration failed to run)",
    }.get(code, f"zephon_torch: {summary}")
    standard = [r for r in runs if not r.zephon]
    if not standard or any(r.error is not None or not r.hashes for r in standard):
        return zephon, "standard loader: not compared (a run gave no steps)"
    if all(r.hashes == standard[0].hashes for r in standard):
        return zephon, "standard loader: curves coincide"
    return zephon, "standard loader: W changes data"


def check_target(path: str | os.PathLike[str]) -> None:
    """Refuse, before any run, a picture that could not be drawn or written: no matplotlib,
    a folder as the target, a name not ending in .png, or a folder that does not exist or
    cannot be written to.

    Raises:
        ConfigError: naming what is missing.
    """
    try:
        _pyplot()
    except ImportError as error:
        raise ConfigError(str(error)) from error
    if Path(path).is_dir():
        raise ConfigError(f"`--plot` {str(path)!r} is a folder: name the picture's file")
    if Path(path).suffix.lower() != ".png":
        raise ConfigError(f"`--plot` {str(path)!r}: the picture is a PNG; name it *.png")
    folder = Path(path).parent
    if not folder.is_dir():
        raise ConfigError(f"`--plot` {str(path)!r}: the folder {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK):
        raise ConfigError(f"`--plot` {str(path)!r}: the folder {str(folder)!r} is not writable")


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as error:
        raise ImportError(
            "`verify --plot` draws with matplotlib: pip install 'zephon-torch[plot]' "
            "(or pip install matplotlib)"
        ) from error
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def render(comparison: Comparison, path: str | Path, *, title: str = "") -> dict[str, Any]:
    """Draw ``comparison`` to a PNG at ``path``; returns the series drawn, by panel and run
    name: ``{"fingerprints": {name: [...]}, "losses": {name: [...]}}``."""
    plt = _pyplot()
    runs = comparison.runs
    series: dict[str, dict[str, list[float]]] = {
        "fingerprints": {r.name: [fingerprint_value(h) for h in r.hashes] for r in runs},
        "losses": {r.name: comparison.losses[r.name] for r in runs if r.name in comparison.losses},
    }
    panels = ["fingerprints", "losses"] if series["losses"] else ["fingerprints"]
    fig, axes = plt.subplots(
        len(panels), 2, figsize=(13, 4.2 * len(panels)), squeeze=False, sharex=True
    )
    titles = panel_titles(runs)
    labels = {
        "fingerprints": "global batch fingerprint (SHA-256 -> [0, 1))",
        "losses": "tiny model training loss",
    }
    for row, panel in enumerate(panels):
        for col, zephon in enumerate((True, False)):
            ax = axes[row][col]
            chosen = [r for r in runs if r.zephon == zephon]
            for i, run in enumerate(chosen):
                ys = series[panel].get(run.name, [])
                if not ys:
                    continue
                style: dict[str, Any] = (
                    {"linewidth": 5, "alpha": 0.35, "color": "black"}
                    if i == 0
                    else {
                        "linewidth": 1.4,
                        "linestyle": "--",
                        "marker": "." if panel != "losses" else None,
                    }
                )
                ax.plot(range(len(ys)), ys, label=run.name, **style)
            if zephon and comparison.fault_step:  # 0: no fault to mark
                ax.axvline(comparison.fault_step - 0.5, color="red", linewidth=0.8, linestyle=":")
            ax.set_ylabel(labels[panel])
            ax.set_title(titles[col] if row == 0 else "")
            ax.legend(fontsize=7, loc="upper right")
            if row == len(panels) - 1:
                ax.set_xlabel("global step")
    if title or comparison.note:
        fig.suptitle("\n".join(t for t in (title, comparison.note) if t), fontsize=10)
    fig.tight_layout()
    fig.savefig(str(path), format="png", dpi=110)
    plt.close(fig)
    return series
