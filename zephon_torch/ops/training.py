"""Training tensors from a packed micro-batch: labels, positions, varlen and block masks.

Everything derives from the row layout (segment lengths per row): a segment is one document's
piece in a row, so attention and positions restart at each one. Built with a few numpy passes
over the whole flattened batch (each row's padding is one more segment); no per-token Python
work. Every tensor is made on the CPU, whatever default device the training script set
(`torch.set_default_device`, a `with torch.device(...)` block): moving them is `to_device`'s.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch

IGNORE_INDEX = -100
# Fields left on the host when the others move to a device: attention kernels take
# `max_seqlen` as an int, and `int()` of a GPU tensor waits for the GPU (in every layer).
HOST_FIELDS = frozenset({"max_seqlen"})


def training_tensors(
    input_ids: npt.NDArray[np.int64],
    lengths: list[list[int]],
    sources: list[list[int]],
    *,
    trainable: npt.NDArray[np.bool_] | None = None,
    mask_document_boundaries: bool = False,
    attention_mask: bool = False,
) -> dict[str, torch.Tensor]:
    """The tensors of a training step for a padded ``[B, S]`` micro-batch.

    Args:
        input_ids: ``[B, S]`` token ids, padded.
        lengths: per row, its segment lengths in order (the rest of the row is padding).
        sources: per row, each segment's source index.
        trainable: ``[B, S]``, whether each token may be a loss target (chat data: assistant
            turns only); a label whose target is not trainable is ``-100``.
        mask_document_boundaries: ``-100`` on the label of each segment's last token, so no
            loss term predicts the first token of the next document from the previous one.
        attention_mask: also return the ``[B, 1, S, S]`` bool block-diagonal causal mask
            (True: may attend), for ``scaled_dot_product_attention``.

    Returns:
        ``input_ids``; ``labels`` (next token; ``-100`` on padding and at row ends);
        ``loss_mask`` (``labels != -100``); ``position_ids`` (restarting per segment, and per
        row's padding); ``document_ids`` (segment index within its row, ``-1`` on padding);
        ``source_ids`` (source index per token, ``-1`` on padding); ``cu_seqlens`` (int32 over
        the flattened ``[B*S]`` tokens, each row's padding as its own segment);
        ``max_seqlen`` (0-d, the longest segment; kept on the host when the rest moves to a
        device, see ``HOST_FIELDS``); ``num_valid_tokens`` (0-d, the labels that are not
        ``-100``); and ``attention_mask`` when asked. ``labels`` are shifted already
        (``labels[t]`` is the token after ``input_ids[t]``): Hugging Face models shift
        ``labels=`` again, so give them these as ``shift_labels=`` too.
    """
    rows, width = input_ids.shape
    # Segments of the whole batch, flat: each row's pieces, then its padding (if any) as one
    # more segment, so every token of the [B*S] batch belongs to exactly one segment.
    used = [sum(row) for row in lengths]
    sizes_list: list[int] = []
    sources_list: list[int] = []
    documents_list: list[int] = []
    for row_lengths, row_sources, row_used in zip(lengths, sources, used, strict=True):
        sizes_list += row_lengths
        sources_list += row_sources
        documents_list += range(len(row_lengths))
        if row_used < width:
            sizes_list.append(width - row_used)
            sources_list.append(-1)
            documents_list.append(-1)
    sizes = np.asarray(sizes_list, dtype=np.int64)
    ends = np.cumsum(sizes)
    segment = np.repeat(np.arange(len(sizes)), sizes)
    position_ids = (np.arange(rows * width) - (ends - sizes)[segment]).reshape(rows, width)
    document_ids = np.asarray(documents_list, dtype=np.int64)[segment].reshape(rows, width)
    source_ids = np.asarray(sources_list, dtype=np.int64)[segment].reshape(rows, width)
    labels = np.full((rows, width), IGNORE_INDEX, dtype=np.int64)
    labels[:, :-1] = input_ids[:, 1:]
    flat_labels = labels.reshape(-1)
    real = document_ids.reshape(-1) >= 0
    if mask_document_boundaries:
        last = ends - 1
        flat_labels[last[real[last]]] = IGNORE_INDEX  # each piece's last token
    flat_labels[~real] = IGNORE_INDEX
    row_ends = np.arange(rows) * width + np.maximum(np.asarray(used, dtype=np.int64), 1) - 1
    flat_labels[row_ends] = IGNORE_INDEX  # no target past the row's last real token
    if trainable is not None:
        labels[:, :-1][~trainable[:, 1:]] = IGNORE_INDEX
    cu = np.concatenate([[0], ends]).astype(np.int32)
    labels_t = torch.from_numpy(labels)
    out = {
        "input_ids": torch.from_numpy(input_ids),
        "labels": labels_t,
        "loss_mask": labels_t != IGNORE_INDEX,
        "position_ids": torch.from_numpy(position_ids),
        "document_ids": torch.from_numpy(document_ids),
        "source_ids": torch.from_numpy(source_ids),
        "cu_seqlens": torch.from_numpy(cu),
        "max_seqlen": torch.tensor(
            int(np.diff(cu).max(initial=0)), dtype=torch.int64, device="cpu"
        ),
        "num_valid_tokens": (labels_t != IGNORE_INDEX).sum(),
    }
    if attention_mask:
        out["attention_mask"] = block_causal_mask(document_ids)
    return out


def block_causal_mask(document_ids: npt.NDArray[np.int64]) -> torch.Tensor:
    """``[B, 1, S, S]``: token i may attend to j when j <= i within the same segment; a padding
    token attends to itself only (so no attention row is empty)."""
    docs = torch.from_numpy(document_ids)
    width = docs.shape[1]
    same = docs[:, :, None] == docs[:, None, :]
    real = (docs >= 0)[:, :, None] & (docs >= 0)[:, None, :]
    causal = torch.ones(width, width, dtype=torch.bool, device="cpu").tril()
    eye = torch.eye(width, dtype=torch.bool, device="cpu")
    return ((same & real & causal) | eye)[:, None, :, :]
