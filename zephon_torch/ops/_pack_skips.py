"""What a lane's packer does with documents that give no tokens: counts, proofs and warnings.

``MixPack`` counts each skipped document by its reason (``SKIP_REASONS``) in its state, warns of
a dataset's first bad row once an iteration, and refuses a source that would be read for ever
without a token (``BarrenRun``, ``GIVE_UP_PASSES``) or that gives a lane ``BAD_START_ROWS`` bad
rows before its first document. Each of the packer's warnings is given once an iteration
(``_first_warning``), whatever the warnings filter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from zephon_torch._caller import warn
from zephon_torch.errors import DataError
from zephon_torch.ops._barren_run import BarrenRun, gave_up_error
from zephon_torch.ops.read import DocumentReader

if TYPE_CHECKING:
    from zephon_torch.ops.stateful import FilteredReader

# why documents are skipped: the length rules, documents of no token, and rows that raised a
# DataError under bad_rows="skip"
SKIP_REASONS = ("too_long", "too_short", "empty", "malformed")
# malformed rows of a source a lane meets before its first document: the BAD_START_ROWS-th raises
# (with a tenth of rows bad at random, 100 in a row come once in 10**100 starts)
BAD_START_ROWS = 100


class SkipAccounting:
    """``MixPack``'s accounting of skipped documents and barren sources (see ``MixPack``)."""

    # set by ``MixPack``
    readers: list[DocumentReader | FilteredReader]
    documents: list[int]
    skipped: dict[str, int]
    drop_longer_than: int | None
    drop_shorter_than: int
    long_rule: str | None
    warned: set[tuple[str, str]]
    line_of: Callable[[int, int, int], str | None] | None
    _barren_runs: list[BarrenRun]
    _filtered: list[bool]
    _bad_start: list[tuple[int, str] | None]

    def _admit(
        self, source: int, size: int, shard: int, row: int, error: str | None = None
    ) -> bool:
        """Count a new document of ``source`` of ``size`` tokens under the length rules (a
        dropped one, an empty one, or one skipped for ``error`` as malformed, as skipped; a
        kept one as delivered); True when it gives tokens."""
        if error is not None:
            self.skipped["malformed"] += 1
            self._warn_bad(source, shard, row, error)
            self._check_bad_start(source, error)
            self._barren(source, shard, row)
            return False
        self._bad_start[source] = None  # a row that tokenized: the count of bad ones ends
        if not size:  # no token, not even a special one (see `with_eos`)
            self.skipped["empty"] += 1
        elif self.drop_longer_than is not None and size > self.drop_longer_than:
            self.skipped["too_long"] += 1
        elif size < self.drop_shorter_than:
            self.skipped["too_short"] += 1
        else:
            self.documents[source] += 1
            self._barren_runs[source].clear()
            return True
        self._barren(source, shard, row)
        return False

    def _dropped(self, source: int, shards: Any, rows: Any) -> None:
        """Count documents of ``source`` the plain filters dropped, stored at ``(shards,
        rows)``, with those that gave no token: a source whose documents the filters and the
        length rules share out between them gives nothing, and neither alone proves it."""
        self._filtered[source] = True  # (no proof its rows tokenize: the bad-row count goes on)
        self._barren(source, shards, rows)

    def _rejected(self, source: int) -> None:
        """Count a document of ``source`` a stateful filter rejected: it ends the run's
        proof (no pure fact of the row), not its dry spell."""
        self._bad_start[source] = None  # a row that tokenized
        self._barren_runs[source].restart()
        self._check_dry(source, 1)

    def _check_dry(self, source: int, added: int = 0) -> None:
        """Refuse ``source`` once it went ``GIVE_UP_PASSES`` lane passes without a token."""
        run, reader = self._barren_runs[source], self.readers[source]
        if run.given_up(reader, added):
            raise gave_up_error(reader, run.dry)

    def _barren(self, source: int, shard: Any, row: Any) -> None:
        """Count documents of ``source`` that gave no tokens (empty, dropped by length or by
        the filters), stored at ``(shard, row)`` (one, or arrays): a source that would be read
        for ever without a token under ``exhaustion="repeat"`` is refused once its run proves
        it (``BarrenRun``), or once it went ``GIVE_UP_PASSES`` lane passes without one."""
        if self._barren_runs[source].extend(self.readers[source], shard, row):
            self._never_gives(source)
        self._check_dry(source)

    def _warn_bad(self, source: int, shard: int, row: int, error: str) -> None:
        """Warn of the first row of ``source``'s dataset skipped for ``error`` (one word per
        dataset and iteration: ``stats()`` counts them all), with its line in its file."""
        if not self._first_warning("bad rows", source):
            return
        place = None if self.line_of is None else self.line_of(source, shard, row)
        warn(
            "bad_rows='skip': skipping rows that raise an error, counted in "
            "stats()['skipped_documents']['malformed'] (one warning per dataset and "
            f"iteration); the first: {error}{'' if place is None else f' ({place})'}",
            once=self._once_key("bad rows", source),
        )

    def _check_bad_start(self, source: int, error: str) -> None:
        """Refuse ``source`` once the first ``BAD_START_ROWS`` of its rows the lane read were
        all malformed: ``bad_rows="skip"`` is for a dataset's few bad rows, and a dataset
        without a good one (a misspelt field, the wrong column) would otherwise be read
        through, a whole pass, for warnings and no batch. Counted from the iteration's start or
        resume, until a row tokenizes (kept, empty, cut by a length rule, or rejected by a
        stateful filter, which sees tokens). A row a plain filter drops proves nothing of the
        fields its tokenizing reads (a misspelt one), so the count goes on past it."""
        counted = self._bad_start[source]
        if counted is None or self.documents[source]:
            return
        count, first = counted[0] + 1, counted[1] or error
        self._bad_start[source] = (count, first)
        if count < BAD_START_ROWS:
            return
        raise DataError(
            f"bad_rows='skip': the first {count} rows of it a lane read were all malformed, and "
            "skipping is for a dataset's few bad rows, not for one without good ones. The "
            f"first: {first}. A field missing from "
            "every row is a misspelt field name (the `field` of tokenize, tokenize_chat or "
            "pretokenized)",
            dataset=self.readers[source].layout.name,
        )

    def _once_key(self, kind: str, source: int) -> tuple[str, str]:
        """The warning's key for the loader's main process (see ``ZephonWarning.once``): DataLoader
        workers share no ``warned``, and each warns of its own first."""
        return (kind, self.readers[source].layout.name)

    def _first_warning(self, kind: str, source: int) -> bool:
        """Whether the warning ``kind`` of ``source``'s dataset is still to be given this
        iteration (the lanes share ``warned``); it counts as given from now on."""
        key = self._once_key(kind, source)
        if key in self.warned:
            return False
        self.warned.add(key)
        return True

    def _empty_words(self) -> str:
        """Why documents gave no token, for an error's words: empty, and, where this lane
        skipped any, malformed."""
        if self.skipped["malformed"]:
            return "empty or skipped as malformed (bad_rows='skip')"
        return "empty"

    def _never_gives(self, source: int) -> None:
        """The ``DataError`` of a source proved to give no token for ever."""
        reader = self.readers[source]
        whole = "a whole pass of this lane" if reader.same_each_pass else "the dataset"
        rules = ["the filters"] if self._filtered[source] else []
        if self.drop_shorter_than:
            rules.append(f"min_document_length={self.drop_shorter_than}")
        if self.drop_longer_than is not None:
            long = f"long_documents='drop' above {self.drop_longer_than} tokens"
            rules.append(self.long_rule or long)
        why = " or ".join(
            [self._empty_words(), *([f"dropped by {' or '.join(rules)}"] if rules else [])]
        )
        raise DataError(
            f"every document of {whole} is {why}: with exhaustion='repeat' it would be read "
            "forever without giving a token",
            dataset=reader.layout.name,
        )
