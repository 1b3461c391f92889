"""A small thread-safe LRU cache whose loads run once per key, however many threads ask.

Readers keep decoded shards, row groups and line indexes here. When 16 threads ask for the same
missing key, one of them loads it and the others wait for its result, so a compressed shard is
decompressed once, not 16 times. Evicted values are only dropped, never closed: another thread
may still hold them, and an mmap or file closes itself when its last reference goes. A cache
used in a forked child (DataLoader workers under "fork") starts empty there, with a new lock: the
parent's lock may have been held by a thread that does not exist in the child.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar, cast

V = TypeVar("V")


class _Pending(Generic[V]):
    """A load in progress that other threads wait on."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: V | None = None
        self.error: BaseException | None = None


class _State(Generic[V]):
    """Everything one process's cache holds, replaced as a whole in a forked child."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.items: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self.pending: dict[Hashable, _Pending[V]] = {}
        self.weight = 0


class LruCache(Generic[V]):
    """A bounded map from keys to values, evicting the least recently used first.

    Args:
        max_items: the most values held at once; at least 1.
        max_weight: optional bound on the summed weight of the values held. The newest value is
            always kept, even when it alone is heavier than the bound.
        weigh: gives a value's weight (for example its size in bytes); needed with `max_weight`.
    """

    def __init__(
        self,
        max_items: int,
        *,
        max_weight: int | None = None,
        weigh: Callable[[V], int] | None = None,
    ) -> None:
        if max_items < 1:
            raise ValueError(f"`max_items` must be at least 1, got {max_items}")
        if (max_weight is None) != (weigh is None):
            raise ValueError("`max_weight` and `weigh` must be given together")
        self._max_items = max_items
        self._max_weight = max_weight
        self._weigh = weigh
        self._state: _State[V] = _State()

    def __len__(self) -> int:
        state = self._current()
        with state.lock:
            return len(state.items)

    def get_or_load(self, key: Hashable, load: Callable[[], V]) -> V:
        """Returns the value for `key`, calling `load` once if it is not held.

        Args:
            key: the cache key.
            load: builds the value; its exception reaches every thread waiting on this key, and
                nothing is cached then, so a later call tries again.

        Returns:
            The cached or freshly loaded value.
        """
        state = self._current()
        with state.lock:
            held = state.items.get(key)
            if held is not None:
                state.items.move_to_end(key)
                return held[0]
            pending = state.pending.get(key)
            owner = pending is None
            if pending is None:
                pending = _Pending()
                state.pending[key] = pending
        # The error's traceback holds this frame, which lets go of ``pending`` (and so of the
        # error) before raising: the cycle kept what the failed read's frames hold (a pipeline
        # and its datasets' open files) until a full garbage collection.
        if not owner:
            pending.done.wait()
            error, loaded = pending.error, pending.value
            del pending
            if error is None:
                return cast("V", loaded)
            try:
                raise error
            finally:
                del error
        try:
            value = load()
        except BaseException as error:
            pending.error = error
            with state.lock:
                del state.pending[key]
            pending.done.set()
            del pending
            raise
        with state.lock:
            self._insert(state, key, value)
            del state.pending[key]
        pending.value = value
        pending.done.set()
        return value

    def _current(self) -> _State[V]:
        # Two threads of a new child may both replace the state; each then finishes on the
        # state it took, consistently under that state's lock, and one result goes uncached.
        state = self._state
        if state.pid != os.getpid():
            state = self._state = _State()
        return state

    def _insert(self, state: _State[V], key: Hashable, value: V) -> None:
        weight = self._weigh(value) if self._weigh is not None else 0
        state.items[key] = (value, weight)
        state.weight += weight
        while len(state.items) > 1 and (
            len(state.items) > self._max_items
            or (self._max_weight is not None and state.weight > self._max_weight)
        ):
            _, (_, old_weight) = state.items.popitem(last=False)
            state.weight -= old_weight
