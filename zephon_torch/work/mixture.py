"""Static mixtures: several datasets, target shares, one seed, and the pure per-lane streams.

The work source decides *which* documents exist in which lane and pass (pure pointer streams);
the packer decides *when* each is used, picking the source furthest below its share of the
total plus one row (smooth weighted round robin on real counts, a row ahead). With
``token_estimation`` the shares are token shares, otherwise document shares. Either way every
lane meets its targets within about one row at every point, so every global batch does too, up
to one row per lane.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Literal

from zephon_torch.errors import ConfigError, finite_number, integer_setting
from zephon_torch.io import Dataset
from zephon_torch.work.pointers import PointerLayout

Exhaustion = Literal["stop", "repeat"]
_EXHAUSTION = ("stop", "repeat")


@dataclass(frozen=True, kw_only=True)
class TokenEstimation:
    """Mix by token shares; calibrate tokens per byte once to size read-ahead.

    The calibration tokenizes ``calibration_documents`` documents of each dataset at the first
    start and is frozen into the state, so a resume never re-measures. It sizes read-ahead only:
    which documents form each batch depends on real token counts, never on the estimate.

    Args:
        calibration_documents: documents read per dataset to calibrate.
        tokens_per_byte: pinned figures per dataset name; those datasets are not tokenized
            to calibrate (their documents are still read to measure bytes per document).
        measure: counts a text's tokens in place of the pipeline's tokenizer (e.g. a cheap
            approximation); unused for pre-tokenized data.
    """

    calibration_documents: int = 16
    tokens_per_byte: Mapping[str, float] | None = None
    measure: Callable[[str], int] | None = None

    def __post_init__(self) -> None:
        pinned = self.tokens_per_byte
        if pinned is not None and not isinstance(pinned, Mapping):
            raise ConfigError(
                "`tokens_per_byte` must map dataset names to numbers "
                f'({{"web": 0.3}}), got {pinned!r}'
            )
        if self.measure is not None and not callable(self.measure):
            raise ConfigError(f"`measure` must be a function of a text, got {self.measure!r}")
        count = integer_setting(self.calibration_documents, "`calibration_documents`")
        object.__setattr__(self, "calibration_documents", count)
        for name, value in (pinned or {}).items():
            number = finite_number(value)
            if number is None or number <= 0:
                raise ConfigError(
                    f"`tokens_per_byte` of {name!r} must be a positive number, got {value!r}"
                )
        if self.calibration_documents < 1:
            raise ConfigError(
                f"`calibration_documents` must be positive, got {self.calibration_documents}"
            )


class StaticMixtureWorkSource:
    """A fixed mixture of datasets with pure, seeded, per-lane pointer streams.

    Args:
        datasets: the datasets; names must be unique.
        mixture: target share per dataset name; any positive numbers, normalised. Default: equal.
        seed: the recipe seed; every permutation is keyed by it and by names.
        token_estimation: when set, shares are token shares; else document shares.
        exhaustion: ``"stop"`` ends a lane once each of its datasets has been read for its
            number of ``passes`` (the last sources to run out fill the tail alone);
            ``"repeat"`` starts a freshly shuffled pass of a dataset whenever it runs out,
            forever.
        passes: with ``"stop"``, passes over each dataset (each reshuffled): one int for all,
            or per dataset name (up-sampling: ``{"small": 3, "big": 1}``). Default 1.
        shuffle: shuffle documents within windows of shards each pass; False reads in order.
        shuffle_window_shards: shards whose rows are shuffled together (bounds open shards);
            a Parquet shard split into window blocks (see `Shard.blocks`) counts once per
            block, so a window's decoded row groups stay bounded whatever the shard size.
    """

    def __init__(
        self,
        datasets: Sequence[Dataset],
        mixture: Mapping[str, float] | None = None,
        *,
        seed: int = 0,
        token_estimation: TokenEstimation | None = None,
        exhaustion: Exhaustion = "stop",
        shuffle: bool = True,
        shuffle_window_shards: int = 4,
        passes: int | Mapping[str, int] | None = None,
    ) -> None:
        if isinstance(datasets, Dataset):
            raise ConfigError("`datasets` must be a list of Datasets, got one Dataset: [it]")
        datasets = tuple(datasets)  # a generator is read once
        if not datasets:
            raise ConfigError("`datasets` must hold at least one Dataset, got none")
        strangers = [d for d in datasets if not isinstance(d, Dataset)]
        if strangers:
            raise ConfigError(f"`datasets` must hold Datasets, got {strangers[0]!r}")
        names = [d.name for d in datasets]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigError(f"dataset names must be unique, repeated: {duplicates}")
        if exhaustion not in _EXHAUSTION:
            raise ConfigError(
                f"`exhaustion` must be one of {list(_EXHAUSTION)}, got {exhaustion!r}"
            )
        shuffle_window_shards = integer_setting(shuffle_window_shards, "`shuffle_window_shards`")
        if shuffle_window_shards < 1:
            raise ConfigError(
                f"`shuffle_window_shards` must be positive, got {shuffle_window_shards}"
            )
        seed = integer_setting(seed, "`seed`")
        if not isinstance(shuffle, bool):
            raise ConfigError(f"`shuffle` must be True or False, got {shuffle!r}")
        if token_estimation is not None and not isinstance(token_estimation, TokenEstimation):
            raise ConfigError(
                f"`token_estimation` must be a TokenEstimation or None, got {token_estimation!r}"
            )
        self.datasets = datasets
        self.weights = _normalise(mixture, names)
        self.seed = seed
        pinned = set((token_estimation and token_estimation.tokens_per_byte) or ())
        unknown = _unknown(pinned, names)
        if unknown:  # a misspelt name would be measured anyway, silently
            raise ConfigError(
                f"`tokens_per_byte` names unknown datasets {unknown}; datasets are {names}"
            )
        self.token_estimation = token_estimation
        self.exhaustion: Exhaustion = exhaustion
        self.passes = _passes(passes, names, exhaustion)
        self.shuffle = shuffle
        self.shuffle_window_shards = shuffle_window_shards
        self.layouts = tuple(
            PointerLayout(
                name=d.name,
                shard_rows=tuple(s.num_rows for s in d.shards),
                shard_blocks=tuple(s.blocks for s in d.shards),
                seed=seed,
                window_shards=shuffle_window_shards,
                shuffle=shuffle,
            )
            for d in datasets
        )

    @property
    def names(self) -> list[str]:
        """Dataset names in source order."""
        return [d.name for d in self.datasets]

    @property
    def mixing(self) -> Literal["tokens", "documents"]:
        """What the mixture weights are shares of."""
        return "tokens" if self.token_estimation is not None else "documents"

    def fingerprint(self) -> dict[str, Any]:
        """Every data-affecting setting of the work source, flat and JSON-able."""
        out: dict[str, Any] = {
            "seed": self.seed,
            "mixing": self.mixing,
            "exhaustion": self.exhaustion,
            "passes": None if self.passes is None else dict(zip(self.names, self.passes)),
            "shuffle": self.shuffle,
            "shuffle_window_shards": self.shuffle_window_shards,
            # the shares as mixed, exactly (JSON keeps a float's every digit): mixtures that
            # mix differently never share a fingerprint
            "mixture": dict(zip(self.names, self.weights)),
        }
        for d in self.datasets:
            out[f"dataset.{d.name}"] = d.fingerprint()
        return out


def _passes(
    passes: int | Mapping[str, int] | None, names: list[str], exhaustion: str
) -> tuple[int, ...] | None:
    if exhaustion == "repeat":
        if passes is not None:
            raise ConfigError("`passes` applies to exhaustion='stop'; 'repeat' never ends")
        return None
    if passes is None:
        passes = 1
    if not isinstance(passes, Mapping):
        passes = dict.fromkeys(names, passes)
    unknown = _unknown(passes, names)
    if unknown:
        raise ConfigError(f"`passes` names unknown datasets {unknown}; datasets are {names}")
    given = {n: passes.get(n, 1) for n in names}
    # whole passes only: int(2.5) would read "small" twice where 2.5 was asked, silently
    bad = {n: p for n, p in given.items() if not _whole(p) or p < 1}
    if bad:
        raise ConfigError(f"`passes` must be positive whole numbers, got {bad}")
    return tuple(int(p) for p in given.values())


def _unknown(keys: Iterable[Any], names: list[str]) -> list[Any]:
    """The ``keys`` that name no dataset, sorted by their text: a key of another type beside
    a string one (``{"web": 1, 3: 1}``) could not be sorted, a bare TypeError for an error
    meant to list them."""
    return sorted(set(keys) - set(names), key=str)


def _whole(value: Any) -> bool:
    """An int (numpy's too, not a bool) or an integral float such as 2.0."""
    if isinstance(value, (bool, str)):
        return False
    try:
        return float(value) == int(value)
    except (TypeError, ValueError, OverflowError):
        return False


def _normalise(mixture: Mapping[str, float] | None, names: list[str]) -> tuple[float, ...]:
    if mixture is None:
        return tuple(1.0 / len(names) for _ in names)
    if not isinstance(mixture, Mapping):  # a list of weights read as names: "unknown [0.5]"
        example = ", ".join(f"{name!r}: ..." for name in names[:2])
        raise ConfigError(
            f"`mixture` must map dataset names to weights, as {{{example}}}; got {mixture!r}"
        )
    unknown = _unknown(mixture, names)
    if unknown:
        raise ConfigError(f"`mixture` names unknown datasets {unknown}; datasets are {names}")
    missing = sorted(set(names) - set(mixture))
    if missing:
        raise ConfigError(f"`mixture` has no weight for datasets {missing}; give every dataset one")
    for name, weight in mixture.items():
        value = finite_number(weight)  # not "0.7", not True, not an int past the largest float
        if value is None or value <= 0:
            raise ConfigError(
                f"`mixture` weight of {name!r} must be a positive finite number, got {weight!r}"
            )
    try:
        total = math.fsum(float(mixture[n]) for n in names)  # the same on every Python
    except OverflowError:
        raise ConfigError(
            f"`mixture` weights {dict(mixture)} sum past the largest float; scale them down"
        ) from None
    shares = tuple(float(mixture[n]) / total for n in names)
    vanished = [n for n, share in zip(names, shares) if share == 0.0]
    if vanished:  # a share past the smallest float: 0.0, and a source of weight 0 divides by it
        raise ConfigError(
            f"`mixture` weights of {vanished} are too small beside the others' sum {total!r}: "
            "their shares round to 0.0; give them larger weights or leave them out"
        )
    return shares


def choose_source(
    weights: Sequence[float], delivered: Sequence[int], active: Sequence[bool], ahead: int
) -> int:
    """The active source furthest below its target share of the total plus ``ahead`` (lowest
    index on ties), or -1.

    Smooth weighted round robin on real counts, a row ahead: the target of source i is
    ``w_i * (total + ahead)``, the weights and the total taken over active sources only, and
    ``ahead`` the same at every pick (the packer passes a row, ``max_length``, or one document).
    Without it every source that has delivered nothing would sit exactly on its target (0),
    so a source weighted 1e-9 would take a lane's second piece. With it a source is picked
    once it is owed part of a row: of two sources, one of share ``w`` first comes after about
    ``ahead * (1 - 2w) / (2w)`` of the other's.
    """
    if len(weights) == 1:
        return 0 if active[0] else -1
    # once per piece packed: plain loops, and the weights' sum cached per set of active sources
    weight_sum = _active_weight(tuple(weights), tuple(active))
    total = ahead
    for d, a in zip(delivered, active):
        if a:
            total += d
    best, best_deficit = -1, -math.inf
    for i, (w, d, a) in enumerate(zip(weights, delivered, active)):
        if a:
            deficit = w / weight_sum * total - d
            if deficit > best_deficit:
                best, best_deficit = i, deficit
    return best


@lru_cache(maxsize=256)
def _active_weight(weights: tuple[float, ...], active: tuple[bool, ...]) -> float:
    """The active sources' weights, summed exactly rounded (``math.fsum``): the same on every
    Python, where the built-in ``sum`` of floats rounds differently since 3.12, which would
    change which source a tie goes to, and so the data, with the interpreter."""
    return math.fsum(w for w, a in zip(weights, active) if a)
