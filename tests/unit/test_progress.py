"""The progress bar: drawn on a terminal, silent anywhere else."""

from __future__ import annotations

import io

from zephon_torch._progress import Progress, progress, track


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_nothing_is_written_when_the_stream_is_not_a_terminal() -> None:
    stream = io.StringIO()
    with progress(10, "indexing", stream=stream) as bar:
        for _ in range(10):
            bar.update()
        bar.note("shard 3")
    assert list(track(range(5), "steps", stream=stream)) == [0, 1, 2, 3, 4]
    assert stream.getvalue() == ""


def test_a_terminal_gets_the_bar_and_the_line_ends_with_a_newline() -> None:
    stream = FakeTerminal()
    assert list(track(range(7), "steps", stream=stream)) == list(range(7))
    text = stream.getvalue()
    assert text.startswith("\rsteps [") and text.endswith("\n")
    assert "7/7 100%" in text.splitlines()[-1]


def test_redraws_are_rate_limited_but_the_final_state_is_always_drawn() -> None:
    stream = FakeTerminal()
    with Progress(None, "bytes", stream=stream) as bar:
        for _ in range(10_000):
            bar.update()
    draws = stream.getvalue().count("\r")
    assert 2 <= draws < 100  # the first update, maybe a few more, and the close
    assert stream.getvalue().rstrip().split("\r")[-1].startswith("bytes 10000 ")


def test_a_callback_reports_done_and_total() -> None:
    stream = FakeTerminal()
    with progress(None, "index", stream=stream) as bar:
        report = bar.callback()
        report(3, 12)
        assert (bar.done, bar.total) == (3, 12)
    assert "3/12" in stream.getvalue()
