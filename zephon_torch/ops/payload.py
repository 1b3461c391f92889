"""Keep chosen row fields whole alongside the tokens, for ``pack_sequences`` (multimodal).

Runs before tokenizing (which drops the row): the named fields are set aside untouched on the
document and travel with it into its packed row, so an image's bytes or an array arrive in the
batch exactly as stored: as the batch's own copy where they could be changed in place (nested
lists and dicts, writable arrays; see ``owned``), so that an edit in the training loop reaches
no later read. A missing field is a ``DataError`` naming the row.
"""

from __future__ import annotations

from typing import Any

from zephon_torch.ops.document import Document, document_error, owned


class PayloadOp:
    """Set ``fields`` of each row aside as the document's payload.

    Args:
        fields: the row fields to keep.
        dataset_names: source index to dataset name, for error messages.
        shard_paths: per source, shard index to path, for error messages.
    """

    def __init__(
        self, fields: tuple[str, ...], *, dataset_names: list[str], shard_paths: list[list[str]]
    ) -> None:
        self.fields = fields
        self.dataset_names = dataset_names
        self.shard_paths = shard_paths

    def __call__(self, docs: list[Document]) -> list[Document]:
        for doc in docs:
            data = doc.data if doc.data is not None else {}
            missing = [f for f in self.fields if f not in data]
            if missing:
                message = f"payload fields {missing} are missing; the row has fields {sorted(data)}"
                raise document_error(
                    doc, message, dataset_names=self.dataset_names, shard_paths=self.shard_paths
                )
            doc.payload = owned({f: data[f] for f in self.fields})  # the loop may edit it
        return docs

    def fingerprint(self) -> dict[str, Any]:
        """The kept fields."""
        return {"kind": "payload", "fields": list(self.fields)}
