"""Training tensors agree with each other and keep attention inside documents."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import small_pipeline
from zephon_torch.ops.training import IGNORE_INDEX, training_tensors


@st.composite
def layouts(draw: st.DrawFn) -> tuple[np.ndarray, list[list[int]], list[list[int]]]:
    width = draw(st.integers(1, 24))
    rows = draw(st.integers(1, 4))
    lengths, sources = [], []
    for _ in range(rows):
        row: list[int] = []
        while sum(row) < width and draw(st.booleans()):
            row.append(draw(st.integers(1, width - sum(row))))
        lengths.append(row)
        sources.append([draw(st.integers(0, 2)) for _ in row])
    ids = np.asarray(
        draw(st.lists(st.integers(0, 999), min_size=rows * width, max_size=rows * width)),
        dtype=np.int64,
    )
    return ids.reshape(rows, width), lengths, sources


def _per_row(
    ids: np.ndarray, lengths: list[list[int]], sources: list[list[int]], mask: bool
) -> dict[str, np.ndarray]:
    """The tensors built row by row, the plain way: the reference for the vectorised code."""
    rows, width = ids.shape
    labels = np.full((rows, width), IGNORE_INDEX, dtype=np.int64)
    labels[:, :-1] = ids[:, 1:]
    positions = np.empty((rows, width), dtype=np.int64)
    documents = np.full((rows, width), -1, dtype=np.int64)
    source_ids = np.full((rows, width), -1, dtype=np.int64)
    cu = [0]
    for r, (row, row_sources) in enumerate(zip(lengths, sources)):
        offset = 0
        for i, n in enumerate(row):
            positions[r, offset : offset + n] = np.arange(n)
            documents[r, offset : offset + n] = i
            source_ids[r, offset : offset + n] = row_sources[i]
            if mask:
                labels[r, offset + n - 1] = IGNORE_INDEX
            offset += n
            cu.append(r * width + offset)
        positions[r, offset:] = np.arange(width - offset)
        labels[r, max(offset - 1, 0) :] = IGNORE_INDEX
        if offset < width:
            cu.append((r + 1) * width)
    return {
        "labels": labels,
        "position_ids": positions,
        "document_ids": documents,
        "source_ids": source_ids,
        "cu_seqlens": np.asarray(cu, dtype=np.int32),
    }


@given(layout=layouts(), mask=st.booleans())
@settings(max_examples=200, deadline=None)
def test_the_vectorised_tensors_equal_the_row_by_row_ones(layout: Any, mask: bool) -> None:
    ids, lengths, sources = layout
    got = training_tensors(ids, lengths, sources, mask_document_boundaries=mask)
    for name, expected in _per_row(ids, lengths, sources, mask).items():
        assert got[name].numpy().tolist() == expected.tolist(), name
        assert got[name].numpy().dtype == expected.dtype, name


@given(layout=layouts(), mask=st.booleans())
@settings(max_examples=200, deadline=None)
def test_positions_documents_cu_seqlens_and_labels_agree(layout: Any, mask: bool) -> None:
    ids, lengths, sources = layout
    t = training_tensors(ids, lengths, sources, mask_document_boundaries=mask, attention_mask=True)
    rows, width = ids.shape
    cu = t["cu_seqlens"].tolist()
    assert cu[0] == 0 and cu[-1] == rows * width and cu == sorted(cu)
    flat_pos = t["position_ids"].flatten().tolist()
    flat_doc = t["document_ids"].flatten().tolist()
    for a, b in itertools.pairwise(cu):
        assert flat_pos[a:b] == list(range(b - a))  # positions restart at every segment
        assert len(set(flat_doc[a:b])) == 1  # one segment (or one row's padding) per span
    assert int(t["max_seqlen"]) == max(b - a for a, b in itertools.pairwise(cu))
    labels = t["labels"]
    for r, row in enumerate(lengths):
        offset = 0
        for i, n in enumerate(row):
            inner = labels[r, offset : offset + n - 1].tolist()
            assert inner == ids[r, offset + 1 : offset + n].tolist()
            last = int(labels[r, offset + n - 1])
            is_row_end = i == len(row) - 1
            if mask or is_row_end:
                assert last == IGNORE_INDEX
            else:
                assert last == ids[r, offset + n]
            assert t["source_ids"][r, offset : offset + n].tolist() == [sources[r][i]] * n
            offset += n
        assert (labels[r, offset:] == IGNORE_INDEX).all()
        assert (t["document_ids"][r, offset:] == -1).all()
    assert torch.equal(t["loss_mask"], labels != IGNORE_INDEX)
    assert int(t["num_valid_tokens"]) == int(t["loss_mask"].sum())


def test_sdpa_with_the_block_mask_never_attends_across_documents(tokenizer: Any) -> None:
    pipeline = small_pipeline(tokenizer, algorithm="best_fit", max_length=256, microbatch_size=4)
    batch = next(b for b in pipeline if max(len(row) for row in b.lengths) > 1)
    t = batch.to_training(attention_mask=True)
    docs = t["document_ids"]  # [B, S]
    assert (docs.max(dim=1).values >= 1).any(), "need rows holding several documents"
    rows, width = docs.shape
    # value vectors one-hot on the document id: attention output mass shows where it looked
    values = torch.nn.functional.one_hot(docs + 1, num_classes=int(docs.max()) + 2).float()[:, None]
    query = torch.randn(rows, 1, width, 8)
    key = torch.randn(rows, 1, width, 8)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, values, attn_mask=t["attention_mask"]
    )
    own = torch.gather(out[:, 0], 2, (docs + 1)[:, :, None])[..., 0]
    assert torch.allclose(own, torch.ones_like(own), atol=1e-5)  # all mass on its own document
    # and causality: the first token of each segment can only see itself
    first = t["position_ids"] == 0
    mask = t["attention_mask"][:, 0]
    assert (mask.sum(-1)[first] == 1).all()


def test_row_sources_name_each_segments_dataset(tokenizer: Any) -> None:
    batch = next(iter(small_pipeline(tokenizer, max_length=256, microbatch_size=2)))
    names = batch.row_sources()
    assert [len(r) for r in names] == [len(r) for r in batch.lengths]
    assert {n for r in names for n in r} <= {"long", "short"}


def test_to_device_moves_every_field_but_max_seqlen(tokenizer: Any) -> None:
    """max_seqlen went to the device too, where each attention layer's int() of it waits for
    the GPU; the others must move (the meta device stands in for a GPU)."""
    from zephon_torch.torch import to_device

    item = next(iter(small_pipeline(tokenizer))).to_training(attention_mask=True)
    moved = to_device(item, "meta")
    assert moved.keys() == item.keys()
    assert moved["max_seqlen"].device.type == "cpu"
    assert int(moved["max_seqlen"]) == int(item["max_seqlen"]) > 0
    assert all(v.device.type == "meta" for k, v in moved.items() if k != "max_seqlen")


def test_the_tensors_are_made_on_the_cpu_under_another_default_device(tokenizer: Any) -> None:
    """Under `torch.set_default_device` (or a `with torch.device(...)` block) max_seqlen was
    made on that device, which README keeps on the host, and the attention mask failed,
    mixing the device's tensors with the CPU's (the meta device stands in for a GPU)."""
    batch = next(iter(small_pipeline(tokenizer)))
    item = batch.to_training(attention_mask=True)
    with torch.device("meta"):
        made = batch.to_training(attention_mask=True)
    assert made.keys() == item.keys()
    for name, value in made.items():
        assert value.device.type == "cpu", name
        assert torch.equal(value, item[name]), name


def test_the_labels_give_a_hugging_face_model_its_loss_as_shift_labels(tokenizer: Any) -> None:
    """The README's advice: labels are shifted already, so a Hugging Face causal LM takes them
    as `shift_labels=` (with `labels=`, which it needs to compute a loss at all); as `labels=`
    alone it shifts them again and scores the token after next. The README gives it for
    transformers 4.50 and newer: 4.48 and 4.49 take `shift_labels=` and ignore it (this test
    fails on them), 4.47 refuses it."""
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM

    if tuple(int(part) for part in transformers.__version__.split(".")[:2]) < (4, 50):
        pytest.skip("the README's shift_labels advice is for transformers 4.50 and newer")

    item = next(iter(small_pipeline(tokenizer))).to_training()
    vocab = int(item["input_ids"].max()) + 1
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    model = LlamaForCausalLM(config).eval()
    ids, labels = item["input_ids"], item["labels"]
    with torch.no_grad():
        out = model(input_ids=ids, labels=labels, shift_labels=labels)
        shifted_again = model(input_ids=ids, labels=labels).loss
    expected = torch.nn.functional.cross_entropy(
        out.logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX
    )
    assert torch.allclose(out.loss, expected)
    assert not torch.allclose(shifted_again, expected)
