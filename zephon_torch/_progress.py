"""A progress bar for long work, drawn only when a person is watching.

The bar is written to a stream (default stderr) with ``\\r`` updates at most ten times a second,
and only when that stream is a terminal: logs, pipes and CI output stay clean. No dependency;
the cost of an update that is not drawn is one clock read.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import TextIO, TypeVar

__all__ = ["Progress", "progress", "track"]

T = TypeVar("T")

_WIDTH = 24
_MIN_INTERVAL = 0.1  # seconds between redraws: at most ~10 Hz


class Progress:
    """A bar of ``done`` out of ``total`` units (a counter when ``total`` is None).

    Use as a context manager; ``update`` adds units, ``set`` jumps to a count (for callbacks
    that report totals), ``note`` changes the text after the bar. ``close`` draws the final
    state and ends the line.

    Args:
        total: the number of units, or None when unknown.
        desc: what is being done, shown before the bar.
        stream: where to draw; default ``sys.stderr``. Nothing is written unless
            ``stream.isatty()``.
    """

    def __init__(self, total: int | None, desc: str, *, stream: TextIO | None = None) -> None:
        if total is not None and total < 0:
            raise ValueError(f"`total` must be >= 0 or None, got {total}")
        self.total = total
        self.desc = desc
        self.done = 0
        self._note = ""
        self._stream = sys.stderr if stream is None else stream
        self.active = _isatty(self._stream)
        self._started = time.perf_counter()
        self._drawn_at = -_MIN_INTERVAL
        self._closed = False

    def update(self, n: int = 1) -> None:
        """Add ``n`` finished units."""
        self.set(self.done + n)

    def set(self, done: int, total: int | None = None) -> None:
        """Record ``done`` finished units (and a new ``total`` when given)."""
        self.done = done
        if total is not None:
            self.total = total
        self._maybe_draw()

    def note(self, text: str) -> None:
        """Show ``text`` after the counts (e.g. the configuration now running)."""
        self._note = text
        self._maybe_draw()

    def callback(self) -> Callable[[int, int | None], None]:
        """A ``(done, total)`` function for code that reports progress through a hook."""
        return self.set

    def close(self) -> None:
        """Draw the final state and end the line (once)."""
        if self._closed:
            return
        self._closed = True
        if self.active:
            self._draw()
            self._stream.write("\n")
            self._stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def _maybe_draw(self) -> None:
        if not self.active or self._closed:
            return
        now = time.perf_counter()
        if now - self._drawn_at >= _MIN_INTERVAL:
            self._drawn_at = now
            self._draw()

    def _draw(self) -> None:
        elapsed = time.perf_counter() - self._started
        if self.total:
            fraction = min(1.0, self.done / self.total)
            filled = int(fraction * _WIDTH)
            bar = "#" * filled + "." * (_WIDTH - filled)
            counts = f"[{bar}] {self.done}/{self.total} {fraction:4.0%}"
        else:
            counts = f"{self.done}"
        note = f" {self._note}" if self._note else ""
        # Trailing spaces erase the tail of a longer previous line.
        self._stream.write(f"\r{self.desc} {counts} {elapsed:5.1f}s{note}  ")
        self._stream.flush()


def progress(total: int | None, desc: str, *, stream: TextIO | None = None) -> Progress:
    """A :class:`Progress` bar (use in a ``with`` block)."""
    return Progress(total, desc, stream=stream)


def track(
    items: Iterable[T], desc: str, *, total: int | None = None, stream: TextIO | None = None
) -> Iterator[T]:
    """Yield ``items``, advancing a bar by one per item; ``total`` defaults to ``len(items)``."""
    if total is None:
        try:
            total = len(items)  # type: ignore[arg-type]
        except TypeError:
            total = None
    with Progress(total, desc, stream=stream) as bar:
        for item in items:
            yield item
            bar.update()


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or minimal stream
        return False
