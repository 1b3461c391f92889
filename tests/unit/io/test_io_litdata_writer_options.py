"""LitData datasets as litdata.optimize and litdata's own reader leave them: chunks that reader
decompressed in place (it replaces each compressed chunk of a local dataset it reads with the
decompressed copy and removes the compressed file), and leaf formats that are not read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.unit.io.test_io_formats_writers import plain, tokens_loader, write_litdata
from zephon_torch.errors import DataError
from zephon_torch.io import Dataset

TOKENS = [np.arange(i % 37 + 1, dtype=np.uint16) * 3 + i for i in range(150)]
ITEMS = [{"text": f"doc {i}", "ids": np.arange(i % 5 + 1, dtype=np.int32)} for i in range(150)]


def every_row(dataset: Dataset) -> list[dict[str, Any]]:
    return [
        plain(row)
        for number, shard in enumerate(dataset.shards)
        for row in dataset.read_rows(number, range(shard.num_rows))
    ]


def read_first_item_with_litdata(out: Path, *, tokens: bool) -> None:
    litdata = pytest.importorskip("litdata")
    loader = litdata.streaming.item_loader.TokensLoader(block_size=8) if tokens else None
    litdata.StreamingDataset(str(out), item_loader=loader)[0]


@pytest.mark.parametrize("compression", ["zstd", "zstd:9"])
def test_chunks_litdata_decompressed_in_place_read_as_before(
    tmp_path: Path, compression: str
) -> None:
    """Once litdata had read a chunk of a local dataset written with `compression_level=
    "chunk"` (the only zstd TokensLoader writes), the index listed a `.zstd.bin` file that
    was gone, and every open was "the shard file is missing"."""
    written = {
        "tokens": write_litdata(
            tmp_path / "tokens",
            TOKENS,
            chunk_bytes=1024,
            item_loader=tokens_loader(),
            compression=compression,
            compression_level="chunk",
        ),
        "items": write_litdata(
            tmp_path / "items",
            ITEMS,
            chunk_bytes=1024,
            compression=compression,
            compression_level="chunk",
        ),
    }
    for name, out in written.items():
        dataset = Dataset.from_path("l", out)
        assert len(dataset.shards) > 2
        rows, fingerprint = every_row(dataset), dataset.fingerprint()
        read_first_item_with_litdata(out, tokens=name == "tokens")
        assert (out / "chunk-0-0.bin").is_file()
        assert not (out / f"chunk-0-0.{compression}.bin").exists()
        assert (out / f"chunk-0-1.{compression}.bin").is_file()  # not read: still compressed
        again = Dataset.from_path("l", out)
        assert every_row(again) == rows
        assert again.fingerprint() == fingerprint
        assert again.shards == dataset.shards


def test_a_chunk_gone_with_no_decompressed_copy_is_still_missing(tmp_path: Path) -> None:
    out = write_litdata(
        tmp_path / "items", ITEMS, chunk_bytes=1024, compression="zstd", compression_level="chunk"
    )
    (out / "chunk-0-1.zstd.bin").unlink()
    with pytest.raises(DataError, match="the shard file is missing") as caught:
        Dataset.from_path("l", out)
    assert caught.value.shard == str(out / "chunk-0-1.zstd.bin")


def pickled_items(index: int) -> dict[str, Any]:
    return {"text": f"doc {index}", "tags": {"a", str(index)}}  # a set: litdata pickles it


def test_a_field_of_a_leaf_format_not_read_is_refused_naming_it_and_can_be_left_out(
    tmp_path: Path,
) -> None:
    """It was "cannot read this LitData index: column 'tags' has leaf format 'pickle'", as
    if the index were damaged, with no way around it said."""
    out = write_litdata(tmp_path / "pickled", range(20), fn=pickled_items)
    with pytest.raises(
        DataError,
        match=r"field 'tags' holds leaf format 'pickle', which is not read \(read: bool, "
        r".*\); leave such a field of dict items out with `columns=`",
    ) as caught:
        Dataset.from_path("l", out)
    assert caught.value.shard == str(out / "index.json")
    dataset = Dataset.from_path("l", out, columns=["text"])
    assert every_row(dataset) == [{"text": f"doc {i}"} for i in range(20)]
