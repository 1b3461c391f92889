"""One corpus written by each format's real writer reads back as the same documents.

300 documents of English cut from the pydoc topics, with an int id and the ids a BPE tokenizer
gives them, are written as JSONL, Parquet (pyarrow), MDS (MDSWriter, plain and zstd), LitData
(litdata.optimize) and Vortex, each in several shards. Every row of every shard is read through
`Dataset.from_path`, and the multisets of (text, id, token ids) must be equal. The
pre-tokenized forms (MDS ndarray, LitData TokensLoader chunks, Parquet lists, `.npy` tokens plus
offsets) must hold what tokenizing the text gives.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from tests.conftest import prose_documents
from tests.unit.io.test_io_formats_writers import (
    tokens_loader,
    write_litdata,
    write_mds,
    write_vortex,
)
from zephon_torch.io import Dataset

COUNT = 300
TOKENS = "input_ids"
Document = tuple[str, int, tuple[int, ...]]


@pytest.fixture(scope="module")
def corpus(tokenizer: Tokenizer) -> list[dict[str, Any]]:
    texts = prose_documents(COUNT, seed=11, min_words=3, max_words=150)
    encoded = tokenizer.encode_batch(texts)
    return [
        {"text": text, "id": number, TOKENS: np.asarray(encoding.ids, dtype=np.int32)}
        for number, (text, encoding) in enumerate(zip(texts, encoded, strict=True))
    ]


def _table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.table(
        {
            "text": [row["text"] for row in rows],
            "id": pa.array([row["id"] for row in rows], pa.int64()),
            TOKENS: pa.array([row[TOKENS] for row in rows], pa.list_(pa.int32())),
        }
    )


def _write_all(root: Path, corpus: list[dict[str, Any]]) -> dict[str, Path]:
    thirds = [corpus[:100], corpus[100:200], corpus[200:]]
    for number, part in enumerate(thirds):
        lines = (json.dumps({**row, TOKENS: row[TOKENS].tolist()}) for row in part)
        (root / "jsonl").mkdir(exist_ok=True)
        (root / "jsonl" / f"{number}.jsonl").write_text("".join(f"{line}\n" for line in lines))
        (root / "parquet").mkdir(exist_ok=True)
        pq.write_table(_table(part), root / "parquet" / f"{number}.parquet", row_group_size=32)
        write_vortex(root / "vortex" / f"{number}.vortex", _table(part))
    mds_columns = {"text": "str", "id": "int", TOKENS: "ndarray:int32"}
    return {
        "jsonl": root / "jsonl",
        "parquet": root / "parquet",
        "vortex": root / "vortex",
        "mds": write_mds(root / "mds", corpus, mds_columns, size_limit=1 << 15),
        "mds-zstd": write_mds(
            root / "mds-zstd", corpus, mds_columns, compression="zstd", size_limit=1 << 15
        ),
        "litdata": write_litdata(root / "litdata", corpus, chunk_bytes=1 << 15),
    }


@pytest.fixture(scope="module")
def written(
    tmp_path_factory: pytest.TempPathFactory, corpus: list[dict[str, Any]]
) -> dict[str, Path]:
    return _write_all(tmp_path_factory.mktemp("formats"), corpus)


def every_row(dataset: Dataset) -> list[dict[str, Any]]:
    return [
        row
        for number, shard in enumerate(dataset.shards)
        for row in dataset.read_rows(number, range(shard.num_rows))
    ]


def as_document(row: dict[str, Any]) -> Document:
    tokens = row[TOKENS]
    assert isinstance(tokens, np.ndarray) and tokens.ndim == 1 and tokens.dtype.kind in "iu"
    return row["text"], row["id"], tuple(tokens.tolist())


def test_every_format_reads_back_the_same_multiset_of_documents(
    written: dict[str, Path], corpus: list[dict[str, Any]]
) -> None:
    expected = Counter(as_document(row) for row in corpus)
    for name, path in written.items():
        dataset = Dataset.from_path(name, path, token_columns=[TOKENS])
        assert dataset.format == name.split("-")[0]
        assert len(dataset.shards) > 1, name
        assert dataset.num_rows == COUNT, name
        assert Counter(as_document(row) for row in every_row(dataset)) == expected, name


def test_a_text_projection_reads_the_same_texts_and_ids_everywhere(
    written: dict[str, Path], corpus: list[dict[str, Any]]
) -> None:
    expected = Counter((row["text"], row["id"]) for row in corpus)
    for name, path in written.items():
        rows = every_row(Dataset.from_path(name, path, columns=["text", "id"]))
        assert all(list(row) == ["text", "id"] for row in rows), name
        assert Counter((row["text"], row["id"]) for row in rows) == expected, name


@pytest.mark.parametrize("name", ["mds", "mds-zstd", "parquet", "litdata", "vortex"])
def test_stored_token_arrays_equal_tokenizing_the_stored_text(
    written: dict[str, Path], tokenizer: Tokenizer, name: str
) -> None:
    rows = every_row(Dataset.from_path(name, written[name], token_columns=[TOKENS]))
    encoded = tokenizer.encode_batch([row["text"] for row in rows])
    assert [row[TOKENS].tolist() for row in rows] == [encoding.ids for encoding in encoded]


def test_litdata_tokens_loader_chunks_hold_the_tokenized_documents(
    tmp_path: Path, corpus: list[dict[str, Any]], tokenizer: Tokenizer
) -> None:
    arrays = [row[TOKENS] for row in corpus]
    out = write_litdata(
        tmp_path / "tokens", arrays, chunk_bytes=1 << 13, item_loader=tokens_loader()
    )
    dataset = Dataset.from_path("tokens", out)
    assert len(dataset.shards) > 1
    read = [tuple(row[TOKENS].tolist()) for row in every_row(dataset)]
    tokenized = [tuple(e.ids) for e in tokenizer.encode_batch([row["text"] for row in corpus])]
    assert Counter(read) == Counter(tokenized)


def test_npy_tokens_with_offsets_hold_the_tokenized_documents(
    tmp_path: Path, corpus: list[dict[str, Any]]
) -> None:
    arrays = [row[TOKENS] for row in corpus]
    for number, part in enumerate((arrays[:150], arrays[150:])):
        np.save(tmp_path / f"{number}.npy", np.concatenate(part))
        offsets = np.concatenate([[0], np.cumsum([len(a) for a in part])])
        np.save(tmp_path / f"{number}.offsets.npy", offsets)
    dataset = Dataset.from_path("npy", tmp_path)
    assert [shard.num_rows for shard in dataset.shards] == [150, 150]
    assert [row[TOKENS].tolist() for row in every_row(dataset)] == [a.tolist() for a in arrays]
