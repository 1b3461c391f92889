"""The column layout of an MDS shard's samples, as its index gives it: decoding a sample's
kept columns, and checking the layout against the shard's own copy of its columns."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from struct import Struct
from typing import Any

from zephon_torch.io._mds_bulk import OneArray
from zephon_torch.io._mds_columns import Decoder


@dataclass(frozen=True)
class SampleLayout:
    """The columns of a shard: all of them, in stored order, and the ones rows keep."""

    names: tuple[str, ...]
    encodings: tuple[str, ...]
    sizes: tuple[int | None, ...]
    decoders: tuple[Decoder | None, ...]  # None for columns the projection drops
    kept: tuple[int, ...]  # positions of kept columns, in the order rows list them
    one_array: OneArray | None = None
    variable: int = field(init=False)  # columns without a fixed size: their lengths lead
    fixed: int = field(init=False)  # the bytes of the fixed-size columns
    lengths: Struct = field(init=False)  # reads those lengths
    columns: tuple[tuple[int | None, Decoder | None], ...] = field(init=False)  # to the last kept

    def __post_init__(self) -> None:
        variable = sum(size is None for size in self.sizes)
        object.__setattr__(self, "variable", variable)
        object.__setattr__(self, "fixed", sum(size for size in self.sizes if size is not None))
        object.__setattr__(self, "lengths", Struct(f"<{variable}I"))
        last = max(self.kept, default=-1) + 1
        columns = tuple(zip(self.sizes[:last], self.decoders[:last], strict=True))
        object.__setattr__(self, "columns", columns)


def columns_disagree(config: memoryview, layout: SampleLayout) -> str | None:
    """What index.json says of a shard's columns that the shard's own copy (MDSWriter's
    config, between the sample offsets and the samples) does not: a column renamed, retyped or
    resized there would be read from the shard's bytes without an error, silently wrong (a str
    column decoded as its first byte). None when they agree, or the shard holds no such JSON
    (another writer's). Checked once per shard load: about 8 us."""
    try:
        stored = json.loads(bytes(config))
    except (ValueError, RecursionError):
        return None
    if not isinstance(stored, dict):
        return None
    recorded = {
        "column_names": list(layout.names),
        "column_encodings": list(layout.encodings),
        "column_sizes": list(layout.sizes),
    }
    for key, value in recorded.items():
        if key in stored and stored[key] != value:
            return f"{key} {value!r} where the shard itself records {stored[key]!r}"
    return None


def decode_sample(sample: memoryview, layout: SampleLayout) -> dict[str, Any]:
    """A sample's kept columns (the columns after the last kept one are not decoded); a
    sample that is not its columns end to end, as the index gives them, is refused."""
    lengths = layout.lengths.unpack_from(sample)
    position, variable, total = 4 * layout.variable, 0, len(sample)
    whole = position + layout.fixed + sum(lengths)
    if whole != total:
        raise ValueError(
            f"its columns, as the index gives them, take {whole} bytes, but it holds {total}"
        )
    values: list[Any] = []
    for fixed, decode in layout.columns:
        if fixed is None:
            end = position + lengths[variable]
            variable += 1
        else:
            end = position + fixed
        if end > total:
            raise ValueError("a column runs past the end of the sample")
        values.append(None if decode is None else decode(sample[position:end]))
        position = end
    names = layout.names
    if len(layout.kept) == 1:
        kept = layout.kept[0]
        return {names[kept]: values[kept]}
    return {names[i]: values[i] for i in layout.kept}
