"""Conversations as ``tokenize_chat`` takes them: a row field holding a list of
``{"role": str, "content": str}``, and the roles the built-in chatml template knows. Apart from
``ops.chat`` so that ``zephon-torch inspect --validate --chat-field`` checks rows with the same
words without importing torch."""

from __future__ import annotations

from typing import Any

from zephon_torch.io._projection import missing_field

CHATML_ROLES = ("system", "user", "assistant", "tool")


def conversation_problem(field: str, data: dict[str, Any]) -> str | None:
    """Why row ``data``'s ``field`` is not a conversation ``tokenize_chat`` takes, a list of
    ``{"role": str, "content": str}`` (None: it is one)."""
    if field not in data:
        return missing_field(field, data)
    fault = _malformed(data[field])
    if fault is None:
        return None
    return f"field {field!r} must be a list of {{'role': str, 'content': str}}: {fault}"


def _malformed(messages: Any) -> str | None:
    """What keeps ``messages`` from being a list of ``{"role": str, "content": str}`` (None:
    nothing), naming the first message at fault."""
    if not isinstance(messages, list):
        return f"it is {_a(messages)}"
    for number, message in enumerate(messages):
        if not isinstance(message, dict):
            return f"message {number} is {_a(message)}"
        for key in ("role", "content"):
            value = message.get(key)
            if not isinstance(value, str):
                what = "missing" if key not in message else _a(value)
                return f"message {number}'s {key!r} is {what}"
    return None


def _a(value: object) -> str:
    """`value`'s type with its article ("an int", "a list"), or "None"."""
    if value is None:
        return "None"
    name = type(value).__name__
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"
