"""User filters: keep a document when ``fn(row)`` is true. Dropped documents are counted by the
lane's reader as it returns the next kept one (``stats()["skipped_documents"]["filtered"]``);
a filter that drops every document of a source is warned of, or refused under
``exhaustion="repeat"``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zephon_torch.errors import ConfigError, DataError
from zephon_torch.ops.document import Document
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
        self._what = f"filter {self.name!r}"  # made once: `_keep` runs per document

    def __call__(self, docs: list[Document]) -> list[Document]:
        return [doc for doc in docs if doc.data is not None and self.apply(self._keep, doc)]

    def given(self, doc: Document) -> Row:
        """A copy of the document's row: a filter decides, and what it changes in its row is
        not kept (it was where the row held no nested value, which `owned` copies, only)."""
        row = super().given(doc)
        return dict(row) if row is doc.data else row

    def _keep(self, row: Row) -> bool:
        # within `apply`: a result with no truth value, or refused, names its row
        return decision(self.fn(row), self._what)

    def fingerprint(self) -> dict[str, Any]:
        """The predicate's name: changing it changes the data."""
        return {"kind": "filter", "name": self.name}


class NoDecision(DataError):
    """A filter returned no decision: None or a callable. The function is at fault, not the
    row it was given, so ``bad_rows="skip"`` never skips it (it would skip every row)."""

    rows_fault = False


def decision(result: Any, what: str) -> bool:
    """The filter ``what``'s ``result`` as True or False (its truth value).

    Raises:
        NoDecision: for None or a callable (a missed `return`, or a predicate returned
            uncalled), which would drop or keep every document without a word; raised inside
            ``call_user``, it gains the row's place.
    """
    if result is None:
        got, hint = "None", "did it miss a `return`?"
    elif callable(result):
        got, hint = f"a callable ({result!r})", "was a function returned, not called?"
    else:
        return bool(result)
    raise NoDecision(
        f"{what} returned {got}: it must return whether to keep the document (True or "
        f"False); {hint}"
    )
