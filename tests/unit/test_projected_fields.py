"""A dataset opened with `columns=` must keep the fields the pipeline reads: the token field and
payload fields are checked when the stage is added, not found missing row by row."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon_torch import ConfigError, Pipeline
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource


def _pipeline(*datasets: Dataset) -> Pipeline:
    return Pipeline(StaticMixtureWorkSource(list(datasets), seed=0))


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    jsonl = tmp_path / "text.jsonl"
    jsonl.write_text("".join(json.dumps({"id": i, "text": f"row {i}"}) + "\n" for i in range(8)))
    parquet = tmp_path / "ids.parquet"
    ids = pa.array([list(range(i + 1)) for i in range(8)], pa.list_(pa.int32()))
    pq.write_table(pa.table({"id": list(range(8)), "ids": ids}), parquet)
    return jsonl, parquet


def test_a_token_field_the_columns_leave_out_is_refused_when_the_stage_is_added(
    files: tuple[Path, Path], tokenizer: Any
) -> None:
    """Before, every row failed at the first batch ("row 0: field 'text' is missing"),
    blamed on the row rather than on `columns=` (a fresh-user trial)."""
    jsonl, parquet = files
    kept = Dataset.from_path("all", jsonl)
    narrow = Dataset.from_path("narrow", jsonl, columns=["id"])
    assert (kept.columns, narrow.columns) == (None, ("id",))
    with pytest.raises(
        ConfigError,
        match=r"dataset 'narrow' was opened with columns=\['id'\], which leaves out 'text', "
        r"the field `tokenize` reads: add it to `columns`",
    ):
        _pipeline(kept, narrow).tokenize(tokenizer=tokenizer)
    ids = Dataset.from_path("ids", parquet, columns=["id"])
    with pytest.raises(ConfigError, match=r"leaves out 'ids', the field `pretokenized` reads"):
        _pipeline(ids).pretokenized("ids")
    # a map may write the field: not checked after one
    _pipeline(narrow).map(lambda row: {"text": str(row["id"])}).tokenize(tokenizer=tokenizer)
    batch = next(iter(_pipeline(kept).tokenize(tokenizer=tokenizer).pack_flat(8).batch(1)))
    assert batch.num_tokens == 8


def test_a_payload_field_the_columns_leave_out_is_refused(files: tuple[Path, Path]) -> None:
    _, parquet = files
    ids = Dataset.from_path("ids", parquet, columns=["ids"], token_columns=["ids"])
    tokens = _pipeline(ids).pretokenized("ids")
    with pytest.raises(ConfigError, match=r"leaves out 'id', the field `payload_fields` reads"):
        tokens.pack_sequences(16, payload_fields=["id"])
    both = Dataset.from_path("both", parquet, columns=["id", "ids"], token_columns=["ids"])
    batch = next(
        iter(_pipeline(both).pretokenized("ids").pack_sequences(16, payload_fields=["id"]).batch(1))
    )
    assert batch.payloads is not None and np.all(batch.input_ids >= 0)
