"""pack_sequences: whole documents only, payloads pass through untouched."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.conftest import prose_documents
from tests.helpers import assert_resumes_at_every_step
from zephon_torch import ConfigError, DataError, Pipeline
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource


def multimodal(count: int) -> Dataset:
    texts = prose_documents(count, seed=8, max_words=60)
    images = [bytes([i % 256]) * (10 + i) for i in range(count)]
    arrays = [np.arange(i, i + 3, dtype=np.float32) for i in range(count)]
    return Dataset.from_dict(
        "mm", {"text": texts, "image": images, "box": arrays, "n": list(range(count))}, shard_size=6
    )


def build(tokenizer: Any, max_length: int = 96) -> Pipeline:
    source = StaticMixtureWorkSource([multimodal(24)], seed=3)
    return (
        Pipeline(source)
        .tokenize(tokenizer=tokenizer)
        .pack_sequences(max_length, payload_fields=["image", "box", "n"])
        .batch(2)
    )


def test_payloads_arrive_whole_with_their_documents(tokenizer: Any) -> None:
    seen = set()
    for batch in build(tokenizer):
        assert batch.payloads is not None
        for starts, payloads in zip(batch.starts_document, batch.payloads):
            assert all(starts)  # never cut
            for payload in payloads:
                n = payload["n"]
                assert payload["image"] == bytes([n % 256]) * (10 + n)
                assert payload["box"].tolist() == [n, n + 1, n + 2]
                seen.add(n)
    assert seen  # long documents are dropped, the rest arrive once
    texts = prose_documents(24, seed=8, max_words=60)
    eos = 1
    fits = {i for i, t in enumerate(texts) if len(tokenizer.encode(t).ids) + eos <= 96}
    assert seen == fits


def test_a_payload_edited_in_the_loop_changes_no_later_read(tokenizer: Any) -> None:
    """A payload was the stored value itself (here the caller's own arrays, elsewhere a
    Parquet row-group cache): normalising it in place changed later passes and resumes."""
    dataset = multimodal(6)
    stored = [[i, i + 1, i + 2] for i in range(6)]  # as `multimodal` writes them

    def boxes() -> list[list[float]]:
        source = StaticMixtureWorkSource([dataset], shuffle=False)
        pipeline = (
            Pipeline(source)
            .tokenize(tokenizer=tokenizer)
            .pack_sequences(4096, payload_fields=["box", "n"], max_sequences_per_bin=1)
            .batch(1)
        )
        seen = []
        for batch in pipeline:
            for payload in batch.payloads[0] if batch.payloads else []:
                seen.append(payload["box"].tolist())
                payload["box"] *= 100  # the loop normalises in place
        return seen

    assert boxes() == stored
    assert boxes() == stored


def test_pack_sequences_resumes_at_every_step(tokenizer: Any) -> None:
    assert_resumes_at_every_step(lambda: build(tokenizer))


def test_pack_sequences_refuses_cutting_algorithms_and_names_missing_payloads(
    tokenizer: Any,
) -> None:
    p = Pipeline(StaticMixtureWorkSource([multimodal(4)])).tokenize(tokenizer=tokenizer)
    with pytest.raises(ConfigError, match="keeps documents whole"):
        p.pack_sequences(64, "wrap")  # type: ignore[arg-type]
    with pytest.raises(DataError, match=r"payload fields \['audio'\] are missing"):
        list(p.pack_sequences(64, payload_fields=["audio"]).batch(1))


def test_every_batch_has_payloads_all_padding_ones_too() -> None:
    """A spent lane's all-padding micro-batch (while another lane still has data) had
    `payloads=None`, breaking a loop over each row's payloads."""
    ids = [[1, 2, 3]] * 6 + [[4, 5, 6, 7, 8, 9, 10]] * 6 + [[1]]
    dataset = Dataset.from_dict("m", {"input_ids": ids, "img": [b"x"] * 13}, shard_size=4)
    source = StaticMixtureWorkSource([dataset], seed=1)
    pipeline = (
        Pipeline(source)
        .options(canonical_replicas=2)
        .pretokenized("input_ids")
        .pack_sequences(8, payload_fields=["img"])
        .batch(2)
    )
    batches = list(pipeline)
    assert any(b.num_tokens == 0 for b in batches)
    for batch in batches:
        assert batch.payloads is not None and len(batch.payloads) == 2
        assert sum(len(row) for row in batch.payloads) == sum(map(len, batch.starts_document))
    assert sum(len(row) for b in batches for row in b.payloads or []) == 13
