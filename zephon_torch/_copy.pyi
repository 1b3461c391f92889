from collections.abc import Sequence
from typing import Any

def fill(parts: Sequence[Any], out: Any, top: int, /) -> bool: ...
