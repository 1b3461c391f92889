"""One line of a JSON Lines shard parsed, and what an error about a line shows of it.

Parsing takes `json.JSONDecoder.raw_decode` where it consumes the line whole, about 3x faster
than `json.loads` on the usual tidy line, and the full decoder otherwise. An error names the
line's start and, where the line is a piece of one JSON document spread over many lines (an
array, a pretty-printed object), says that the file is not JSON Lines.
"""

from __future__ import annotations

import json
from typing import Any

_PREVIEW_CHARS = 60
_DECODER = json.JSONDecoder()
_RAW_DECODE = _DECODER.raw_decode


def parse(line: bytes) -> Any:
    """Parses one UTF-8 line like `json.loads`, only about 3x faster on the usual tidy line.

    `json.loads` spends most of a short line's time detecting the encoding and checking for
    surrounding whitespace. A line that `raw_decode` consumes whole is parsed already; any
    other (leading or trailing whitespace, a BOM, an error) takes the full decoder, which also
    gives the error message `json.loads` would. A BOM starts the first line of a file some
    editors write, and any line of files joined by `cat`: it is left out. Invalid UTF-8 raises
    UnicodeDecodeError (json.loads would let lone surrogates through).
    """
    text = line.decode("utf-8")
    try:
        value, stop = _RAW_DECODE(text)
    except ValueError:
        stop = -1
    if stop == len(text):
        return value
    return _DECODER.decode(text[1:] if text.startswith("\ufeff") else text)


def preview(line: bytes) -> str:
    return line[:_PREVIEW_CHARS].decode("utf-8", errors="replace")


def one_document(line: bytes) -> str:
    """A hint where a line that does not parse is part of a JSON document spread over lines
    (an array, or a pretty-printed object: a bracket alone, or an indented `"key": value`),
    which is not JSON Lines; or where it holds many lines ended by a carriage return alone
    (old Mac endings), which JSON Lines does not count as line ends."""
    if b"\r" in line.rstrip(b"\r"):  # a raw CR inside the line: never in a JSON string
        return (
            "; the line holds carriage returns (\\r) inside it: were the file's lines ended "
            "by \\r alone (old Mac endings)? JSON Lines ends each with \\n (\\r\\n reads "
            "too); convert the file"
        )
    stripped = line.strip()
    indented = line[:1] in (b" ", b"\t") and stripped[:1] == b'"' and b'":' in stripped
    if stripped in (b"[", b"{", b"]", b"}", b"},", b"}]", b"{}") or indented:
        return (
            "; the file looks like one JSON document over many lines, not JSON Lines (one "
            "object per line): convert it, or leave it out of the dataset"
        )
    return ""
