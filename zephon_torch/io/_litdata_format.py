"""The LitData chunk format, read without litdata: chunk layouts, leaf decoders, tree specs.

A chunk is `[uint32 n][uint32 offsets[n + 1]][items]`, optionally followed by an Arrow IPC file
(older writers: an IPC stream) of the same rows (`[ipc][uint32 length]LDARW01\\0`; newer writers
store flat JSON-like rows only there), optionally zstd-compressed whole (`.zstd.bin`) or framed
(`LDFZ01` magic: logical item offsets plus independently compressed frames of items). A
`PyTreeLoader` item is `[uint32 size of each leaf][leaf bytes]`; a `TokensLoader` item is the raw
token array. Leaves are decoded by the `data_format` names in `index.json`; tensors come back as
numpy arrays. A `json` leaf (a list or dict value of a dict item) is litdata's compact nested
encoding, a tag byte first, or JSON text from older writers.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

Decoder = Callable[[memoryview], Any]

FOOTER_MAGIC = b"LDARW01\0"
FRAMED_MAGIC = b"LDFZ01\0\0"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_FRAMED_PREFIX = struct.Struct("<8sHHIII")
_FRAME = struct.Struct("<IIQII")
MAX_TREE_DEPTH = 100  # of an item's containers; torch's pytrees of real items are a few deep

# litdata's index tables of numpy and torch dtypes; absent entries are not numeric.
_NUMPY_DTYPES = dict(
    enumerate(
        "<i1 <i2 <i4 <i8 <u1 <u2 <u4 <u8 <f2 <f4 <f8 <c8 <c16 ?".split()  # noqa: SIM905
    )
)
_TORCH_DTYPES = {
    **dict.fromkeys((0, 1), "<f4"),
    **dict.fromkeys((2, 3), "<f8"),
    **dict.fromkeys((4, 5), "<c8"),
    **dict.fromkeys((6, 7), "<c16"),
    **dict.fromkeys((8, 9), "<f2"),
    11: "<u1",
    12: "<i1",
    **dict.fromkeys((13, 14), "<i2"),
    **dict.fromkeys((15, 16), "<i4"),
    **dict.fromkeys((17, 18), "<i8"),
    19: "?",
    20: "<u2",
}
ARRAY_LEAVES = frozenset({"numpy", "no_header_numpy", "tensor", "no_header_tensor"})


def _numpy(view: memoryview) -> npt.NDArray[Any]:
    dtype, ndim = struct.unpack_from("<II", view)
    shape = struct.unpack_from(f"<{ndim}I", view, 8)
    return np.frombuffer(view, _NUMPY_DTYPES[dtype], offset=8 + 4 * ndim).reshape(shape)


def _tensor(view: memoryview) -> npt.NDArray[Any]:
    dtype, ndim = struct.unpack_from(">II", view)
    shape = struct.unpack_from(f">{ndim}I", view, 8)
    return np.frombuffer(view, _TORCH_DTYPES[dtype], offset=8 + 4 * ndim).reshape(shape)


_U32 = struct.Struct("<I")
_RECORD_SCALARS = {0x12: struct.Struct("<q"), 0x13: struct.Struct("<d")}  # int, float
_NESTED_SCALARS = {8: struct.Struct("<q"), 9: struct.Struct("<d")}
_NESTED_ARRAYS = {2: "<i8", 3: "<f8"}  # lists of ints, of floats


def _nested(view: memoryview) -> Any:
    """A `json` leaf: litdata's compact nested encoding, or JSON text (a first byte above
    0x20, as JSON text starts)."""
    raw = bytes(view)
    try:
        if not raw or raw[0] > 0x20:
            return json.loads(raw)
        value, end = _nested_at(raw, 0)
    except RecursionError:
        raise ValueError("a json leaf nests too deep") from None
    if end != len(raw):
        raise ValueError(f"a json leaf holds {len(raw) - end} bytes past its value")
    return value


def _text_at(raw: bytes, at: int) -> tuple[str, int]:
    end = at + 4 + _U32.unpack_from(raw, at)[0]
    if end > len(raw):
        raise ValueError("a json leaf's text runs past its end")
    return raw[at + 4 : end].decode("utf-8"), end


def _nested_at(raw: bytes, at: int) -> tuple[Any, int]:
    """The value tagged at `raw[at]` and where it ends."""
    tag = raw[at]
    if tag == 11:
        return None, at + 1
    if tag == 10:
        return raw[at + 1] != 0, at + 2
    if tag == 7:
        return _text_at(raw, at + 1)
    if tag in _NESTED_SCALARS:
        return _NESTED_SCALARS[tag].unpack_from(raw, at + 1)[0], at + 9
    count = _U32.unpack_from(raw, at + 1)[0]
    at += 5
    if tag == 0:  # JSON text of `count` bytes
        end = at + count
        if end > len(raw):
            raise ValueError("a json leaf's text runs past its end")
        return json.loads(raw[at:end]), end
    if tag in _NESTED_ARRAYS:
        end = at + 8 * count
        if end > len(raw):
            raise ValueError("a json leaf's list runs past its end")
        return np.frombuffer(raw, _NESTED_ARRAYS[tag], count, at).tolist(), end
    if tag == 4:  # bools
        if at + count > len(raw):
            raise ValueError("a json leaf's list runs past its end")
        return [byte != 0 for byte in raw[at : at + count]], at + count
    values: list[Any] = []
    if tag == 1:  # strs
        for _ in range(count):
            text, at = _text_at(raw, at)
            values.append(text)
        return values, at
    if tag == 5:  # dict
        mapping: dict[str, Any] = {}
        for _ in range(count):
            key, at = _text_at(raw, at)
            mapping[key], at = _nested_at(raw, at)
        return mapping, at
    if tag == 6:  # records: `count` dicts of the same keys, each value tagged
        keys: list[str] = []
        key_count, at = _U32.unpack_from(raw, at)[0], at + 4
        for _ in range(key_count):
            key, at = _text_at(raw, at)
            keys.append(key)
        if count and not keys:  # litdata writes keyless dicts as JSON: no bytes bound `count`
            raise ValueError("a json leaf has records of no keys")
        for _ in range(count):
            record: dict[str, Any] = {}
            for key in keys:
                kind, at = raw[at], at + 1
                if kind == 0x10:
                    record[key] = None
                elif kind == 0x11:
                    record[key], at = _text_at(raw, at)
                elif kind == 0x14:
                    record[key], at = raw[at] != 0, at + 1
                elif kind in _RECORD_SCALARS:
                    record[key], at = _RECORD_SCALARS[kind].unpack_from(raw, at)[0], at + 8
                else:
                    raise ValueError(f"a json leaf has an unknown record tag {kind}")
            values.append(record)
        return values, at
    raise ValueError(f"a json leaf has an unknown tag {tag}")


_LEAVES: dict[str, Decoder] = {
    "bool": lambda view: view[0] != 0,
    "bytes": bytes,
    "float": lambda view: struct.unpack("<d", view)[0],
    "int": lambda view: struct.unpack("<q", view)[0],
    "str": lambda view: str(view, "utf-8"),
    "text": lambda view: str(view, "utf-8"),
    "numpy": _numpy,
    "tensor": _tensor,
    "json": _nested,
}


def not_read(field: str, leaf: str) -> str:
    """The message for a field holding a leaf format that is not read (pickle, images and
    other media: a pickle would run code from the data)."""
    read = ", ".join((*sorted(_LEAVES), "no_header_numpy", "no_header_tensor"))
    return (
        f"field {field!r} holds leaf format {leaf!r}, which is not read (read: {read}); "
        "leave such a field of dict items out with `columns=`"
    )


def decompressed_name(name: str, compression: object) -> str | None:
    """The name litdata's own reader gives a chunk file that it decompresses in place
    (`chunk-0-0.zstd.bin` becomes `chunk-0-0.bin`, the `compression` named in index.json
    dropped), or None for a chunk not compressed whole."""
    suffix = f".{compression}.bin"
    if not isinstance(compression, str) or not compression or not name.endswith(suffix):
        return None
    return name[: -len(suffix)] + ".bin"


def leaf_dtype(name: str) -> np.dtype[Any] | None:
    """The value type of a headerless array leaf (`no_header_numpy:<n>`,
    `no_header_tensor:<n>`), else None."""
    kind, _, argument = name.partition(":")
    tables = {"no_header_numpy": _NUMPY_DTYPES, "no_header_tensor": _TORCH_DTYPES}
    if kind not in tables or not argument.isdigit():
        return None
    found = tables[kind].get(int(argument))
    return None if found is None else np.dtype(found)


def leaf_decoder(name: str) -> Decoder | None:
    """Returns the decoder of a `data_format` entry, or None when it is not read."""
    kind, _, argument = name.partition(":")
    tables = {"no_header_numpy": _NUMPY_DTYPES, "no_header_tensor": _TORCH_DTYPES}
    if kind in tables:
        dtype = tables[kind].get(int(argument)) if argument.isdigit() else None
        if dtype is None:
            return None
        return lambda view: np.frombuffer(view, dtype)
    return _LEAVES.get(kind)


@dataclass(frozen=True)
class Node:
    """A node of an item's tree: a dict, list or tuple of nodes, or a leaf (`kind` None)."""

    kind: str | None
    keys: tuple[str, ...]
    children: tuple[Node, ...]
    leaves: int

    def build(self, leaves: Iterator[Any]) -> Any:
        """Rebuilds the value of this node from its leaves, in order."""
        if self.kind is None:
            return next(leaves)
        values = [child.build(leaves) for child in self.children]
        if self.kind == "dict":
            return dict(zip(self.keys, values, strict=True))
        return values if self.kind == "list" else tuple(values)


def parse_tree(text: str) -> Node:
    """Parses litdata's `data_spec` (torch's serialized pytree spec, protocol 1).

    Raises:
        ValueError: for another protocol, a container other than dict, list and tuple, or a
            tree nested deeper than `MAX_TREE_DEPTH` (items are rebuilt recursively).
    """
    try:
        try:
            protocol, spec = json.loads(text)
        except (TypeError, ValueError) as error:  # not JSON, or not a pair
            raise _not_a_tree(text, error) from None
        if protocol != 1:
            raise ValueError(f"unknown data_spec protocol {protocol}")
        try:
            return _node(spec, MAX_TREE_DEPTH)
        except (TypeError, KeyError, AttributeError, json.JSONDecodeError) as error:
            raise _not_a_tree(text, error) from None
    except RecursionError:  # in the JSON text, or the dict keys' JSON inside it
        raise ValueError("the data_spec nests too deeply to parse") from None


def _not_a_tree(text: Any, error: Exception) -> ValueError:
    shown = repr(text) if len(repr(text)) <= 80 else repr(text)[:77] + "..."
    return ValueError(
        f"its data_spec {shown} is not the item tree litdata.optimize writes (a JSON text "
        f'[1, {{"type", "context", "children_spec"}}]: {type(error).__name__}: {error}); '
        "write the dataset again"
    )


def _node(spec: dict[str, Any], depth: int) -> Node:
    if depth == 0:
        raise ValueError(f"the data_spec nests items deeper than {MAX_TREE_DEPTH} levels")
    kind = spec["type"]
    children = tuple(_node(child, depth - 1) for child in spec["children_spec"])
    if kind is None:
        return Node(kind=None, keys=(), children=(), leaves=1)
    names = {"builtins.dict": "dict", "builtins.list": "list", "builtins.tuple": "tuple"}
    if kind not in names:
        raise ValueError(f"items of type {kind} are not read (dicts, lists, tuples are)")
    keys = tuple(json.loads(spec["context"])) if kind == "builtins.dict" else ()
    if keys and not all(isinstance(key, str) for key in keys):
        raise ValueError("dict items must have str keys")
    leaves = sum(child.leaves for child in children)
    return Node(kind=names[kind], keys=keys, children=children, leaves=leaves)


@dataclass(frozen=True)
class Frame:
    """One zstd frame of a framed chunk: items `[first, first + count)`."""

    first: int
    count: int
    start: int
    length: int
    inflated: int


@dataclass(frozen=True)
class Layout:
    """Where a chunk's items are: item i spans `offsets[i]:offsets[i + 1]` of the body.

    The body is the chunk itself, or for a framed chunk the concatenation of its inflated
    frames (whose item offsets start at 0). `footer` spans the trailing Arrow IPC file.
    """

    offsets: npt.NDArray[np.int64]
    frames: tuple[Frame, ...]
    footer: tuple[int, int] | None


def parse_layout(data: memoryview, items: int) -> Layout:
    """Parses a chunk's header (after whole-file decompression).

    Raises:
        ValueError: when the header does not hold `items` items or is truncated.
    """
    if bytes(data[:8]) == FRAMED_MAGIC:
        return _parse_framed(data, items)
    count = struct.unpack_from("<I", data)[0] if len(data) >= 4 else -1
    header = 4 * (count + 2)
    if count != items or len(data) < header:
        raise ValueError(f"the header says {count} items where index.json records {items}")
    offsets = np.frombuffer(data, "<u4", count=count + 1, offset=4).astype(np.int64)
    end = len(data)
    footer = None
    # items that end where the chunk does leave no room for a footer: the last one's bytes
    # may end as the footer's magic does
    if len(data) >= 12 and bytes(data[-8:]) == FOOTER_MAGIC and offsets[-1] != end:
        length = struct.unpack_from("<I", data, end - 12)[0]
        footer = (end - 12 - length, length)
        end = footer[0]
    if offsets[0] != header or offsets[-1] > end or np.any(np.diff(offsets) < 0):
        raise ValueError("the item offsets are corrupt or point past the end")
    if footer is None and offsets[-1] != end:
        raise ValueError(f"the items end at byte {offsets[-1]}, the chunk at {end}")
    return Layout(offsets=offsets, frames=(), footer=footer)


def _parse_framed(data: memoryview, items: int) -> Layout:
    _, version, _, count, _, frames = _FRAMED_PREFIX.unpack_from(data)
    if version != 1 or count != items:
        raise ValueError(f"framed chunk v{version} holds {count} items, index.json {items}")
    start = _FRAMED_PREFIX.size
    offsets = np.frombuffer(data, "<u4", count=count + 1, offset=start).astype(np.int64)
    table = start + 4 * (count + 1)
    parsed = [
        Frame(*_FRAME.unpack_from(data, table + number * _FRAME.size)) for number in range(frames)
    ]
    if not parsed or any(frame.start + frame.length > len(data) for frame in parsed):
        raise ValueError("a compressed frame runs past the end of the chunk")
    # the frames hold the items in turn, each its items' bytes: damage to this shared table
    # would otherwise cut items short or long, each read as its own row's fault
    firsts = [0]
    for frame in parsed:
        firsts.append(firsts[-1] + frame.count)
    tiled = firsts[:-1] == [f.first for f in parsed] and firsts[-1] == count
    if not tiled or np.any(np.diff(offsets) < 0):
        raise ValueError("the item offsets or frame table are corrupt")
    if any(offsets[f.first + f.count] - offsets[f.first] != f.inflated for f in parsed):
        raise ValueError("the item offsets do not match the sizes of their compressed frames")
    return Layout(offsets=offsets, frames=tuple(parsed), footer=None)
