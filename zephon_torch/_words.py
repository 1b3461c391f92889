"""Counts as the library's reports and messages write them."""

from __future__ import annotations


def counted(number: int, noun: str) -> str:
    """``number`` ``noun``, plural unless one, the number with thousands separators:
    "1 shard", "1,024 rows"."""
    return f"{number:,} {noun}{'' if number == 1 else 's'}"
