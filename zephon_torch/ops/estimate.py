"""Token estimation: measure a few documents per dataset once, size read-ahead from it.

The figures only decide how many documents a read-ahead chunk holds (about 8k tokens), never
which documents form a batch. They are frozen into the state so a resume sizes chunks the same.
"""

from __future__ import annotations

import math
from typing import Any

from zephon_torch._progress import track
from zephon_torch.errors import ConfigError, DataError, finite_number, row_fault
from zephon_torch.ops._doc_chain import DocChain
from zephon_torch.ops.document import call_user
from zephon_torch.work.mixture import TokenEstimation
from zephon_torch.work.pointers import PointerLayout

DEFAULT_CHUNK_DOCS = 32
CHUNK_TOKENS = 8192


def calibrate(
    chain: DocChain,
    layouts: tuple[PointerLayout, ...],
    *,
    estimation: TokenEstimation,
    field: str,
) -> dict[str, dict[str, float]]:
    """Per dataset: tokens per document and, for text, tokens per byte (first documents),
    honouring pinned figures and a custom ``measure``."""
    pinned = estimation.tokens_per_byte or {}
    out: dict[str, dict[str, float]] = {}
    for source, layout in enumerate(track(layouts, "calibrating token estimation")):
        count = min(estimation.calibration_documents, layout.num_rows)
        pointers = layout.pointers(pass_index=0, lane=0, num_lanes=1, start=0, count=count)
        docs = [d for d in chain.run(source, pointers, chain.ops[:-1]) if d.error is None]
        owned = [
            (t, d) for d in docs if d.data is not None and isinstance(t := d.data.get(field), str)
        ]
        texts = [text for text, _ in owned]
        skipped = 0  # documents whose `measure` raised a row's error, under bad_rows="skip"
        # surrogatepass: a text that is not valid Unicode is named by the tokenizer (DataError)
        text_bytes = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts)
        if texts and layout.name in pinned:
            tokens = pinned[layout.name] * text_bytes
        elif texts and estimation.measure is not None:
            tokens = 0.0
            datasets = chain.datasets
            names = [dataset.name for dataset in datasets]
            paths = [[shard.path for shard in dataset.shards] for dataset in datasets]
            for text, doc in owned:
                try:
                    counted = call_user(
                        estimation.measure,
                        text,
                        doc,
                        "TokenEstimation `measure`",
                        dataset_names=names,
                        shard_paths=paths,
                    )
                except DataError as error:
                    # a row the run will skip (its tokenizer refuses it too) is not counted
                    # here either; any other error is the measure's own
                    if not (chain.skip_bad_rows and row_fault(error)):
                        raise
                    if chain.apply(source, chain.ops[-1:], [doc])[0].error is None:
                        raise
                    skipped += 1
                    text_bytes -= len(text.encode("utf-8", "surrogatepass"))
                    continue
                number = finite_number(counted)
                if number is None or number < 0:
                    raise ConfigError(
                        f"TokenEstimation `measure` gave {counted!r} tokens for a document of "
                        f"dataset {layout.name!r}; it must count a text's tokens (a number "
                        ">= 0)"
                    )
                tokens += counted
        else:
            docs = [d for d in chain.apply(source, chain.ops[-1:], docs) if d.error is None]
            tokens = float(sum(len(d.tokens) for d in docs if d.tokens is not None))
        # plain floats: a pinned figure or a measure's count may be a numpy number, which
        # the state (plain JSON) cannot hold
        figures = {"tokens_per_document": float(tokens) / max(1, len(docs) - skipped)}
        if text_bytes:
            figures["tokens_per_byte"] = float(tokens) / text_bytes
        out[layout.name] = figures
    return out


def chunk_sizes(estimation: dict[str, Any] | None, names: list[str]) -> list[int]:
    """Documents per read-ahead chunk for each source: about ``CHUNK_TOKENS`` tokens."""
    out = []
    for name in names:
        per_doc = float((estimation or {}).get(name, {}).get("tokens_per_document", 0.0))
        docs = DEFAULT_CHUNK_DOCS if per_doc <= 0 else math.ceil(CHUNK_TOKENS / per_doc)
        out.append(max(1, min(256, docs)))
    return out
