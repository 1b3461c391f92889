"""Locating documents in shuffle windows: all windows of a chunk at once vs a call a window.

A lane's chunk of ``--chunk`` positions is located by ``PointerLayout.span`` (each window
present permuted in the same numpy passes, ``permute_runs``) and, as the baseline in the same
run, by the code before it: one ``permute`` call and one key a window. Shards of 2, 10 and 300
rows (one document a file is common in code and web data), ``--lanes`` 1 and 16, 4 shards a
window; prints seconds per 100k documents of each and the speed-up. Both must give the same
pointers, else the run stops with exit code 2. Each figure is the best of ``--repeats``,
the two sides interleaved.

    .venv/bin/python benchmarks/locate.py [--documents 100000] [--chunk 1024] [--repeats 3]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from zephon_torch.work._hashing import stable_key
from zephon_torch.work._permutation import permute
from zephon_torch.work.pointers import PointerLayout

Locate = Callable[[int, int], tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]]


def a_call_a_window(layout: PointerLayout, lane: int, lanes: int) -> Locate:
    """``span``'s shards and rows of a chunk as the code before ``permute_runs`` found them."""
    built = layout._layout(0)
    starts = built.window_starts

    def locate(start: int, count: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        global_pos = np.arange(start, start + count, dtype=np.int64) * lanes + lane
        window = np.searchsorted(starts, global_pos, side="right") - 1
        offsets = np.empty_like(global_pos)
        cuts = [0, *(np.flatnonzero(np.diff(window)) + 1).tolist(), len(window)]
        for a, b in itertools.pairwise(cuts):
            w = int(window[a])
            begin, end = int(starts[w]), int(starts[w + 1])
            key = stable_key(layout.seed, layout.name, 0, "window", w)
            offsets[a:b] = begin + permute(global_pos[a:b] - begin, end - begin, key)
        ordered = np.searchsorted(built.ordered_starts, offsets, side="right") - 1
        rows = offsets - built.ordered_starts[ordered] + built.block_rows[ordered]
        return built.block_shards[ordered], rows

    return locate


def all_at_once(layout: PointerLayout, lane: int, lanes: int) -> Locate:
    """``span``'s shards and rows of a chunk."""

    def locate(start: int, count: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        span = layout.span(pass_index=0, lane=lane, num_lanes=lanes, start=start, count=count)
        return span.shards, span.rows

    return locate


def seconds(locate: Locate, documents: int, chunk: int) -> tuple[float, list[int]]:
    """Seconds to locate ``documents`` lane positions in chunks, and a sample of them."""
    sample: list[int] = []
    start = time.perf_counter()
    for pos in range(0, documents, chunk):
        shards, rows = locate(pos, min(chunk, documents - pos))
        sample += shards[::97].tolist() + rows[::97].tolist()
    return time.perf_counter() - start, sample


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=100_000, help="per setting and side")
    parser.add_argument("--chunk", type=int, default=1024, help="lane positions a span")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"seconds per 100k documents, best of {args.repeats}; 4 shards a window")
    for rows in (2, 10, 300):
        for lanes in (1, 16):
            num_shards = -(-args.documents * lanes // rows)
            layout = PointerLayout(
                name="web", shard_rows=(rows,) * num_shards, seed=7, window_shards=4, shuffle=True
            )
            sides = {"a call a window": a_call_a_window, "all at once": all_at_once}
            best = dict.fromkeys(sides, float("inf"))
            samples = {}
            for _ in range(args.repeats):
                for name, make in sides.items():
                    took, samples[name] = seconds(
                        make(layout, lanes - 1, lanes), args.documents, args.chunk
                    )
                    best[name] = min(best[name], took * 100_000 / args.documents)
            if samples["a call a window"] != samples["all at once"]:
                print(f"{rows}-row shards, {lanes} lanes: the two orders differ")
                sys.exit(2)
            old, new = best["a call a window"], best["all at once"]
            print(
                f"{rows:4d}-row shards, {lanes:2d} lanes: a call a window {old:7.3f} s, "
                f"all at once {new:7.3f} s, {old / new:5.1f}x"
            )


if __name__ == "__main__":
    main()
