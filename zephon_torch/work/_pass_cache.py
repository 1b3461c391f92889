"""A process-wide cache of per-pass values, bounded per dataset and in datasets.

Pass layouts (``pointers._pass_layout``) are pure functions of a dataset's settings and a pass
index, shared by every copy of a layout in the process (a lane's readers, a rank's lanes), and
O(shards) each. A plain LRU over (dataset, pass) let one long ``exhaustion="repeat"`` run fill
every slot with past passes of one dataset (64 passes of a 100,000-shard dataset held 147 MiB in
every rank and worker), while a mixture of more datasets than slots computed each dataset's
layout again at every use. Here each dataset keeps only its most recently used passes, and
datasets are evicted least recently used first, bounded by the size of what is held (a
layout's shard blocks) rather than only by their number: a bound of 256 datasets made a
mixture of 300, read in turn, compute a layout, O(shards), at every chunk it read. The bound
by size applies only past ``min_keys`` datasets: one dataset whose passes weigh near it, read
beside a few small ones, was otherwise evicted at each small one's turn and computed again at
its own (every lookup a miss).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class PassCache(Generic[V]):
    """``make(key, pass_index)`` memoised: per ``key``, the ``passes`` most recently used pass
    indices; at most ``keys`` keys, and, past ``min_keys`` keys, values of at most
    ``max_weight`` in all (``weigh`` each; the key just used stays), least recently used keys
    first out. Thread-safe; ``make`` runs outside the lock (it is pure: two threads computing
    the same value keep either)."""

    def __init__(
        self,
        make: Callable[[Hashable, int], V],
        *,
        passes: int = 4,
        keys: int = 256,
        weigh: Callable[[V], int] = lambda value: 1,
        max_weight: int | None = None,
        min_keys: int = 1,
    ) -> None:
        self._make = make
        self._passes = passes
        self._keys = keys
        self._weigh = weigh
        self._max_weight = max_weight
        self._min_keys = max(1, min_keys)
        self._weight = 0  # of every value held
        self._held: OrderedDict[Hashable, OrderedDict[int, V]] = OrderedDict()
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def _forked(self) -> None:
        """In a forked child, a lock of its own: one a parent thread held at the fork would
        stay held in the child for ever (the values held are still good: they are pure)."""
        if self._pid != os.getpid():
            self._lock, self._pid = threading.Lock(), os.getpid()

    def __call__(self, key: Hashable, pass_index: int) -> V:
        self._forked()
        with self._lock:
            passes = self._held.get(key)
            if passes is not None:
                self._held.move_to_end(key)
                value = passes.get(pass_index)
                if value is not None:
                    passes.move_to_end(pass_index)
                    return value
        value = self._make(key, pass_index)
        with self._lock:
            passes = self._held.setdefault(key, OrderedDict())
            self._held.move_to_end(key)
            if pass_index in passes:  # another thread made it meanwhile
                self._weight -= self._weigh(passes[pass_index])
            passes[pass_index] = value
            self._weight += self._weigh(value)
            passes.move_to_end(pass_index)
            while len(passes) > self._passes:
                self._weight -= self._weigh(passes.popitem(last=False)[1])
            limit = self._max_weight
            while len(self._held) > self._keys or (
                limit is not None and self._weight > limit and len(self._held) > self._min_keys
            ):
                _, evicted = self._held.popitem(last=False)
                self._weight -= sum(map(self._weigh, evicted.values()))
        return value

    def held(self) -> dict[Hashable, list[int]]:
        """Per key, the pass indices held, least recently used first."""
        self._forked()
        with self._lock:
            return {key: list(passes) for key, passes in self._held.items()}

    def values(self) -> list[V]:
        """Every value held."""
        self._forked()
        with self._lock:
            return [v for passes in self._held.values() for v in passes.values()]

    def cache_clear(self) -> None:
        """Drop everything held."""
        self._forked()
        with self._lock:
            self._held.clear()
            self._weight = 0
