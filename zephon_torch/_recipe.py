"""A recipe's fingerprint: every data-affecting setting, flat, for a saved state to match."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from zephon_torch._token_stage import doc_ops, pad_id

if TYPE_CHECKING:
    from zephon_torch.pipeline import Pipeline


def recipe_fingerprint(self: Pipeline) -> dict[str, Any]:
    """Lanes, work source, per-document operators, packing, stateful filters and row shuffle;
    performance knobs (runners, parallelism, prefetch, the micro-batch size: see
    ``_regroup``) stay out."""
    assert self._pack is not None
    out = {"canonical_replicas": self._options.canonical_replicas, **self._source.fingerprint()}
    out["ops"] = [op.fingerprint() for op in doc_ops(self)]
    out["pack"] = {
        "max_length": self._pack.max_length,
        "algorithm": self._pack.algorithm,
        "num_bins": self._pack.num_bins if self._pack.algorithm != "wrap" else None,
        "pad_token_id": pad_id(self),
        "max_sequences_per_bin": self._pack.max_sequences_per_bin,
        "long_documents": self._pack.long_documents,
        "min_document_length": self._pack.min_document_length,
        "payload_fields": list(self._pack.payload_fields),
    }
    out["stateful_filters"] = [name for _, name in self._stateful]
    out["shuffle_window"] = self._shuffle_window
    return out
