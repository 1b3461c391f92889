"""Python literals parsed one thread at a time.

CPython 3.11 keeps the AST builder's recursion count in interpreter-wide state, so two threads
inside `ast.literal_eval` at once can fail each other with "SystemError: AST constructor
recursion depth mismatch" (CPython issue gh-106905; reproduced here on 3.11.7, not on 3.10,
3.12 or 3.13). Every parse of zephon_torch goes through `literal_eval` or holds `AST_LOCK`;
`.npy` headers as numpy writes them are read without `ast` at all (see `io.npy.read_header`).
"""

from __future__ import annotations

import ast
import threading
from typing import Any

AST_LOCK = threading.Lock()


def literal_eval(text: str) -> Any:
    """`ast.literal_eval` under `AST_LOCK`."""
    with AST_LOCK:
        return ast.literal_eval(text)
