"""Decoders for the column encodings of MosaicML MDS shards, written from the format.

An MDS sample is `[uint32 size of each variable-size column][column bytes, in column order]`;
columns with a fixed size (scalars, `ndarray:<dtype>:<shape>`) have no size entry. Values are
little-endian. Arrays are zero-copy, read-only views of the shard buffer. Scalars come back as
Python numbers (MDS itself returns numpy scalars) so rows stay JSON-friendly. Image encodings
`jpeg` and `png` come back as the encoded file bytes; `pil`, `pkl`, `jpeg_array` and the
`list[...]` encodings are not read (pickle would run code from the data).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from functools import lru_cache
from struct import Struct
from typing import Any

import numpy as np
import numpy.typing as npt

Decoder = Callable[[memoryview], Any]

_SCALARS = {
    "uint8": "<u1",
    "uint16": "<u2",
    "uint32": "<u4",
    "uint64": "<u8",
    "int8": "<i1",
    "int16": "<i2",
    "int32": "<i4",
    "int64": "<i8",
    "float16": "<f2",
    "float32": "<f4",
    "float64": "<f8",
}
# The value-type byte of `ndarray` columns without a fixed dtype.
_ARRAY_DTYPES = {
    8: "uint8",
    9: "int8",
    16: "uint16",
    17: "int16",
    18: "float16",
    32: "uint32",
    33: "int32",
    34: "float32",
    64: "uint64",
    65: "int64",
    66: "float64",
}
_SHAPE_CODES = ("B", "H", "I", "Q")  # struct codes of the shape's u1, u2, u4 and u8 (little end)


def _text(view: memoryview) -> str:
    return str(view, "utf-8")


def _json(view: memoryview) -> Any:
    return json.loads(str(view, "utf-8"))


def _int(view: memoryview) -> int:
    return int.from_bytes(view, "little", signed=True)


def _scalar(dtype: str) -> Decoder:
    return lambda view: np.frombuffer(view, dtype, count=1)[0].item()


_DECODERS: dict[str, Decoder] = {
    "bytes": bytes,
    "jpeg": bytes,
    "png": bytes,
    "str": _text,
    "int": _int,
    "json": _json,
    "str_int": lambda view: int(_text(view)),
    "str_float": lambda view: float(_text(view)),
    "str_decimal": lambda view: Decimal(_text(view)),
    **{name: _scalar(dtype) for name, dtype in _SCALARS.items()},
}

SUPPORTED = (*sorted(_DECODERS), "ndarray")
"""The encodings read, for messages."""


def decoder(encoding: str) -> Decoder | None:
    """Returns the decoder of an MDS column encoding, or None when it is not supported.

    Raises:
        ValueError: for a malformed `ndarray` encoding.
    """
    name, _, config = encoding.partition(":")
    if name == "ndarray":
        return _array_decoder(config)
    if config:
        return None
    return _DECODERS.get(name)


@lru_cache(maxsize=256)
def _shape_header(byte: int) -> Struct:
    """The shape's struct for the byte before it: its dimension count (high six bits) and
    the size code of each dimension (low two bits)."""
    return Struct(f"<{byte >> 2}{_SHAPE_CODES[byte & 3]}")


def array_config(config: str) -> tuple[np.dtype[Any] | None, tuple[int, ...] | None]:
    """An `ndarray` encoding's stated dtype and shape (the part after `ndarray:`); None for
    either when each sample carries its own.

    Raises:
        ValueError: for an unknown dtype.
    """
    dtype_name, _, shape_text = config.partition(":")
    if dtype_name and dtype_name not in _SCALARS:
        raise ValueError(f"unknown ndarray dtype {dtype_name!r}")
    dtype = np.dtype(_SCALARS[dtype_name]) if dtype_name else None
    shape = tuple(int(part) for part in shape_text.split(",")) if shape_text else None
    return dtype, shape


def _array_decoder(config: str) -> Decoder:
    dtype, shape = array_config(config)

    def decode(view: memoryview) -> npt.NDArray[Any]:
        index = 0
        value_dtype = dtype
        if value_dtype is None:
            value_dtype = np.dtype(_SCALARS[_ARRAY_DTYPES[view[0]]])
            index = 1
        dims = shape
        if dims is None:
            header = _shape_header(view[index])
            dims = header.unpack_from(view, index + 1)
            index += 1 + header.size
        array = np.frombuffer(view, value_dtype, offset=index)
        if len(dims) == 1 and array.size == dims[0]:
            return array  # already the shape: skip reshape's call
        return array.reshape(dims)

    return decode
