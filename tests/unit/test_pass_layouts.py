"""Pass layouts are cached per process, bounded per dataset and in datasets (``PassCache``)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Hashable
from typing import Any

import pytest

from zephon_torch.work import pointers
from zephon_torch.work._pass_cache import PassCache
from zephon_torch.work.pointers import PointerLayout


def _layout(name: str, shards: int) -> PointerLayout:
    return PointerLayout(name=name, shard_rows=(3,) * shards, seed=7, window_shards=4, shuffle=True)


def _touch(layout: PointerLayout, pass_index: int) -> list[int]:
    span = layout.span(pass_index=pass_index, lane=0, num_lanes=2, start=5, count=4)
    return span.shards.tolist() + span.rows.tolist()


def test_a_long_run_holds_only_its_recent_passes_of_a_big_dataset() -> None:
    """20 passes of a 20,000-shard dataset: the layouts held stay a few passes' worth (a plain
    LRU of 64 entries held all 20: 9.6 MB here, 147 MiB for 64 passes of 100,000 shards)."""
    layout = _layout("big", 20_000)
    pointers._pass_layout.cache_clear()
    tracemalloc.start()
    try:
        _touch(layout, 0)
        one, _ = tracemalloc.get_traced_memory()
        for pass_index in range(1, 20):
            _touch(layout, pass_index)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        pointers._pass_layout.cache_clear()
    assert held < 6 * one, (held, one)


def test_a_mixture_of_many_datasets_computes_each_layout_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """100 datasets read in turn, as a mixture's lanes read them: each pass layout is computed
    once (64 (dataset, pass) slots computed every one again at each use)."""
    made: list[str] = []
    real = pointers.stable_key

    def counting(*parts: Any) -> int:
        if parts[3:4] == ("shards",):  # a pass layout's shard order
            made.append(parts[1])
        return real(*parts)

    monkeypatch.setattr(pointers, "stable_key", counting)
    pointers._pass_layout.cache_clear()
    layouts = [_layout(f"d{i}", 10) for i in range(100)]
    first = [_touch(layout, 0) for layout in layouts]
    again = [_touch(layout, 0) for layout in layouts]
    pointers._pass_layout.cache_clear()
    assert again == first
    assert sorted(made) == sorted(f"d{i}" for i in range(100))


def test_cached_layouts_are_the_computed_ones() -> None:
    """What the cache returns after evictions is what a fresh computation gives."""
    layout = _layout("small", 50)
    pointers._pass_layout.cache_clear()
    seen = {p: _touch(layout, p) for p in range(12)}
    for p in (11, 3, 0, 11, 7):
        assert _touch(layout, p) == seen[p]
    pointers._pass_layout.cache_clear()
    for p in (7, 0):
        assert _touch(layout, p) == seen[p]


def test_pass_cache_keeps_recent_passes_per_key_and_recent_keys() -> None:
    calls: list[tuple[str, int]] = []

    def make(key: Any, pass_index: int) -> tuple[str, int]:
        calls.append((key, pass_index))
        return key, pass_index

    cache = PassCache(make, passes=2, keys=3)
    assert cache("a", 0) == ("a", 0)
    cache("a", 1)
    cache("a", 0)  # used again: pass 1 is now the least recent
    cache("a", 2)
    assert cache.held() == {"a": [0, 2]}
    for key in "bcd":
        cache(key, 0)
    assert list(cache.held()) == ["b", "c", "d"]  # "a" was the least recently used key
    calls.clear()
    cache("c", 0)
    cache("a", 0)
    assert calls == [("a", 0)]
    assert sorted(cache.values()) == [("a", 0), ("c", 0), ("d", 0)]


def test_a_forked_child_does_not_wait_on_a_lock_a_parent_thread_held_at_the_fork() -> None:
    """A lock held by a thread of the parent at the fork stays held in the child for ever:
    the child makes a lock of its own (an lru_cache, before, took none of its own)."""
    import os
    import signal
    import threading

    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    layout = _layout("forked", 10)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with pointers._pass_layout._lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait(10)
    pid = os.fork()
    if pid == 0:  # the child: a layout lookup must not block (killed by the alarm if it does)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(20)
        _touch(layout, 0)
        os._exit(0)
    release.set()
    holder.join()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status


def test_a_mixture_of_hundreds_of_datasets_computes_each_layout_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """300 datasets read in turn: at most 256 datasets were kept, so a mixture of more,
    read in turn, computed a layout (O(shards)) again at every use."""
    made: list[str] = []
    real = pointers.stable_key

    def counting(*parts: Any) -> int:
        if parts[3:4] == ("shards",):
            made.append(parts[1])
        return real(*parts)

    monkeypatch.setattr(pointers, "stable_key", counting)
    pointers._pass_layout.cache_clear()
    layouts = [_layout(f"d{i}", 10) for i in range(300)]
    for _ in range(3):
        for layout in layouts:
            _touch(layout, 0)
    pointers._pass_layout.cache_clear()
    assert sorted(made) == sorted(f"d{i}" for i in range(300))


def test_pass_cache_lets_the_least_recent_keys_go_past_its_weight() -> None:
    cache = PassCache(lambda key, pass_index: (key, pass_index), weigh=lambda v: 2, max_weight=5)
    for key in "abc":
        cache(key, 0)
    assert list(cache.held()) == ["b", "c"]  # 6 > 5: "a" went
    cache("b", 1)  # "b" holds 4 now, "c" 2: "c" goes, the key just used stays
    assert cache.held() == {"b": [0, 1]}
    cache("b", 2)
    cache("b", 3)  # one key is kept whatever it weighs
    assert cache.held() == {"b": [0, 1, 2, 3]}


def test_pass_cache_keeps_a_heavy_key_beside_light_ones_up_to_its_min_keys() -> None:
    """One dataset whose passes weigh near the bound, read in turn with small ones: each small
    one's turn evicted it, and each of its own computed it again (every lookup a miss)."""
    made: list[tuple[str, int]] = []

    def make(key: Hashable, pass_index: int) -> str:
        made.append((str(key), pass_index))
        return str(key)

    def weigh(value: str) -> int:
        return 90 if value == "big" else 1

    cache = PassCache(make, weigh=weigh, max_weight=100, min_keys=8)
    for _ in range(5):
        for key in ["big", *"abcde"]:
            cache(key, 0)
            cache(key, 1)  # the big one's two passes weigh 180, past the bound alone
    assert len(made) == 12  # each (key, pass) once
    # past min_keys the bound applies again, least recently used first
    for key in "fgh":
        cache(key, 0)
    assert "big" not in cache.held() and len(cache.held()) == 8
