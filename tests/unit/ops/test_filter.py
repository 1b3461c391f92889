"""A plain `filter` decides which documents are kept; it never changes one."""

from __future__ import annotations

from typing import Any

import pytest

from zephon_torch import Pipeline
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource


def prefix_and_keep(row: dict[str, Any]) -> bool:
    row["text"] = "edited " + row["text"]  # a change in place, which a filter does not keep
    return not row["text"].endswith("3")


@pytest.mark.parametrize("runner", ["inline", "processes"])
@pytest.mark.parametrize("nested", [False, True])
def test_a_filter_changing_its_row_in_place_changes_no_document(
    tokenizer: Any, runner: str, nested: bool
) -> None:
    """Its change reached the tokenizer where the row held no nested value, and not where it
    held one (a list column, which the filter got a copy of the row for): the data hung on
    an unrelated column."""
    columns: dict[str, Any] = {"text": [f"doc {i}" for i in range(5)]}
    if nested:
        columns["tags"] = [["a"] for _ in range(5)]
    source = StaticMixtureWorkSource([Dataset.from_dict("d", columns)], shuffle=False)
    pipeline = (
        Pipeline(source)
        .filter(prefix_and_keep)
        .tokenize(tokenizer=tokenizer, runner=runner, parallelism=1, special_tokens="none")  # type: ignore[arg-type]
        .pack_flat(64, "best_fit", max_sequences_per_bin=1)
        .batch(1)
    )
    texts = [tokenizer.decode(b.input_ids[0, : b.num_tokens].tolist()) for b in pipeline]
    assert texts == ["doc 0", "doc 1", "doc 2", "doc 4"]
