"""User filters: keep a document when ``fn(row)`` is true. Dropped documents are counted by the
lane's reader as it returns the next kept one (``stats()["skipped_documents"]["filtered"]``);
a filter that drops every document of a source is warned of, or refused under
``exhaustion="repeat"``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zephon_torch.errors import ConfigError
from zephon_torch.ops.document import Document, document_error
from zephon_torch.ops.map import Row, UserOp, function_name


class FilterOp(UserOp):
    """Keep documents whose row satisfies ``fn``.

    Args:
        fn: a pure predicate on the row dict; picklable for the processes runner.
        name: names the predicate in the state fingerprint; defaults to ``function_name``'s.
    """

    kind = "filter"

    def __init__(self, fn: Callable[[Row], bool], *, name: str | None = None) -> None:
        if not callable(fn):
            raise ConfigError(f"`filter` needs a callable, got {fn!r}")
        self.fn = fn
        self.name = function_name(fn, name)

    def __call__(self, docs: list[Document]) -> list[Document]:
        kept = []
        for doc in docs:
            if doc.data is None:
                continue
            keep = self.apply(self._keep, doc)
            if keep is True:
                kept.append(doc)
            elif keep is not False:  # None, or a callable: refused, naming the row
                self._refuse(doc, keep)
        return kept

    def _keep(self, row: Row) -> Any:
        return decision(self.fn(row))  # within `apply`: no truth value names its row

    def _refuse(self, doc: Document, result: Any) -> None:
        message = f"filter {self.name!r} {refusal(result)}"
        if self.where is None:
            raise ConfigError(message)
        names, paths = self.where
        raise document_error(doc, message, dataset_names=names, shard_paths=paths)

    def fingerprint(self) -> dict[str, Any]:
        """The predicate's name: changing it changes the data."""
        return {"kind": "filter", "name": self.name}


def decision(result: Any) -> Any:
    """A filter's ``result`` as True or False (its truth value), but None or a callable as it
    is: a missed `return`, or a predicate returned uncalled, would drop or keep every
    document without a word (see ``refusal``)."""
    return result if result is None or callable(result) else bool(result)


def refusal(result: Any) -> str:
    """Why a filter's ``result`` that is no decision (``decision``) is refused."""
    if result is None:
        got, hint = "None", "did it miss a `return`?"
    else:
        got, hint = f"a callable ({result!r})", "was a function returned, not called?"
    return f"returned {got}: it must return whether to keep the document (True or False); {hint}"
