from collections.abc import Sequence
from typing import Any

def fill(parts: Sequence[Any], out: Any, top: int, /) -> bool: ...
def walk(values: Any, params: Any, /) -> None: ...
def take(
    chunk: Any,
    first: int,
    stop: int,
    room: int,
    source: int,
    parts: list[Any],
    owners: list[Any],
    sizes: list[int],
    starts: list[bool],
    /,
) -> tuple[int, int, int]: ...
def places(
    data: Any,
    offsets: Any,
    layout: tuple[int, ...],
    shifts: Any,
    firsts: Any,
    stops: Any,
    /,
) -> bool: ...
