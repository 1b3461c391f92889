"""User stateful operators: per-lane, serial decisions whose state lives in the pipeline state.

A ``StatefulFilter`` sees one source's tokenized documents of one lane in stream order (the
factory makes one per lane and source) and decides whether each is kept, updating its own
state (a deduplicating filter, a curriculum).
It runs on the lane's serial thread, after the parallel stateless work, and its
``state_dict()`` is stored in the lane state, so resume is exact. It decides, it never edits:
a kept document must be reproducible by re-reading it (edit documents with ``map``).
"""

from __future__ import annotations

import copy
import json
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, NoReturn

import numpy as np
import numpy.typing as npt
from torchdata.nodes import BaseNode

from zephon_torch._caller import warn
from zephon_torch._state import state_dict_of, state_int
from zephon_torch.errors import ConfigError, DataError, ZephonError
from zephon_torch.ops.document import Document, call_user
from zephon_torch.ops.filter import decision
from zephon_torch.ops.map import Where
from zephon_torch.ops.read import DocumentReader
from zephon_torch.work.pointers import PointerLayout


class StatefulFilter(ABC):
    """Base class of user stateful filters; one instance per lane and source.

    Subclasses implement ``keep``, ``state_dict`` and ``load_state_dict``; ``name`` goes into
    the recipe fingerprint (change it when the rule changes); a subclass that sets none is
    named by its class, ``module.qualname`` (see ``filter_name``).
    """

    name: str = "stateful_filter"

    @abstractmethod
    def keep(self, tokens: npt.NDArray[Any], source: str) -> bool:
        """Whether to keep this document (called once per document, in stream order);
        ``tokens`` are its ids as int32, ``source`` its dataset's name."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The filter's state as plain JSON data; called once per micro-batch, whose state
        keeps a deep copy (so returning the live objects is safe, and a large state costs a
        copy per micro-batch)."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict()``; ``state`` is a copy of the filter's own (so keeping it
        and updating it in place is safe). Called as every iteration starts: with the loaded
        state, else the one the filter had when made."""


def made_filter(
    factory: Callable[[int], StatefulFilter], lane: int, name: str, made: set[int]
) -> StatefulFilter:
    """``factory(lane)``, a new filter for one lane and dataset; ``made`` holds the ids of
    those made before for the other lanes and datasets.

    Raises:
        ConfigError: naming the filter and lane, for an exception of the factory, a result
            that is no StatefulFilter, or one it made before (an instance shared by lanes
            decides on their documents together, so the batches change with the world size).
    """
    try:
        op = factory(lane)
    except ZephonError:
        raise
    except Exception as error:
        raise ConfigError(
            f"stateful filter {name!r}: its factory raised {type(error).__name__} for lane "
            f"{lane}: {error}"
        ) from error
    if not isinstance(op, StatefulFilter):
        got = type(op).__name__
        raise ConfigError(
            f"stateful filter {name!r}: its factory must return a StatefulFilter, got {got} "
            f"for lane {lane}"
        )
    if id(op) in made:
        raise ConfigError(
            f"stateful filter {name!r}: its factory returned an instance it had returned "
            f"before (for lane {lane}); it must make a new one on every call, one per lane and "
            "dataset: a shared one decides on several lanes' documents together, so the "
            "batches would change with the world size"
        )
    made.add(id(op))
    return op


def filter_name(op: StatefulFilter) -> str:
    """The filter's ``name`` where it or a subclass sets one, else its class's
    ``module.qualname``: one default name for every filter let a state saved with one resume
    with another."""
    if "name" in getattr(op, "__dict__", {}) or any(
        "name" in vars(cls) for cls in type(op).__mro__ if cls is not StatefulFilter
    ):
        return op.name
    return f"{type(op).__module__}.{type(op).__qualname__}"


def plain_copy(value: Any, op: StatefulFilter, where: str = "") -> Any:
    """A copy of ``value``, the state ``op`` gave, checked to be plain JSON data on the way
    (numpy numbers become Python's).

    Raises:
        ConfigError: naming the filter and the place of the first value JSON would not give
            back as it was: a set, bytes, an array, a tuple (JSON has lists only), a key that
            is not a string (JSON makes it one), any other object.
    """
    if value is None or type(value) in (str, bool, int, float):
        return value
    if isinstance(value, np.generic) and type(plain := value.item()) in (bool, int, float):
        return plain  # a numpy number (a counter updated with numpy): JSON writes it plain
    if type(value) is dict:
        for key in value:
            if type(key) is not str:
                _not_plain(op, f"{where}[{key!r}]", f"a key of type {type(key).__name__}")
        return {key: plain_copy(item, op, f"{where}[{key!r}]") for key, item in value.items()}
    if type(value) is list:
        return [plain_copy(item, op, f"{where}[{i}]") for i, item in enumerate(value)]
    _not_plain(op, where, f"a {type(value).__module__}.{type(value).__qualname__}")


def _not_plain(op: StatefulFilter, where: str, what: str) -> NoReturn:
    raise ConfigError(
        f"stateful filter {filter_name(op)!r}: its state_dict() must be plain JSON data (dicts "
        f"with string keys, lists, str, int, float, bool, None), which a checkpoint saves and a "
        f"resume gives back as it was; state{where} holds {what}"
    )


class FilteredReader(BaseNode[Document]):
    """A lane's source reader with a stateful filter applied in order.

    State:
        ``{"reader": reader state, "filter": the filter's state_dict(), "rejected": the
        documents it rejected}`` (states saved before the count load with 0).
    """

    def __init__(
        self, reader: DocumentReader, op: StatefulFilter, source_name: str, where: Where
    ) -> None:
        super().__init__()
        self.reader = reader
        self.op = op
        self.source_name = source_name
        self.where = where  # dataset names and shard paths, for errors naming a row
        self.on_rejected: Callable[[], None] | None = None  # told of each rejection
        self._initial = plain_copy(op.state_dict(), op)
        self.rejected = 0  # documents the filter rejected, from the stream's start

    def reset(self, initial_state: dict[str, Any] | None = None) -> None:
        """Start fresh or restore the reader's position and the filter's state."""
        super().reset(initial_state)
        # the filter gets a copy: it may keep (and go on updating) the dict it loads, while
        # the state it came from is still a delivered batch's, the pipeline's saved lane
        # state, or the block start a shuffle hands out with its block's later batches
        if initial_state is None:
            self.reader.reset(None)
            self._load(copy.deepcopy(self._initial))
            self.rejected = 0
        else:
            state = state_dict_of(initial_state, ("reader", "filter"), "stateful filter")
            # None would restart the reader at the stream's start: no release writes it
            self.reader.reset(state_dict_of(state["reader"], (), "stateful filter reader"))
            self._load(copy.deepcopy(state["filter"]))
            self.rejected = state_int(state.get("rejected", 0), "stateful filter rejected")

    def _load(self, state: dict[str, Any]) -> None:
        """The filter's ``load_state_dict(state)``; its errors name the filter, lane and
        dataset (it is called as every iteration starts, with the state the filter was made
        with where no state was loaded)."""
        try:
            self.op.load_state_dict(state)
        except ZephonError:
            raise
        except Exception as error:
            raise ConfigError(
                f"stateful filter {filter_name(self.op)!r} of lane {self.lane}, dataset "
                f"{self.source_name!r}: its load_state_dict raised {type(error).__name__}: "
                f"{error}"
            ) from error

    @property
    def layout(self) -> PointerLayout:
        """The dataset's pointer layout."""
        return self.reader.layout

    @property
    def lane(self) -> int:
        """The canonical lane read."""
        return self.reader.lane

    @property
    def lane_rows(self) -> int:
        """Documents in one pass of this lane, before filtering."""
        return self.reader.lane_rows

    @property
    def exhaustion(self) -> str:
        """The reader's exhaustion policy."""
        return self.reader.exhaustion

    def unread(self) -> tuple[int, int]:
        """This lane's documents not yet read, and all of them (see ``DocumentReader``)."""
        return self.reader.unread()

    def check_position(self, pass_index: int, pos: int, *, document: bool = False) -> None:
        """Refuse a saved position past the stream (see ``DocumentReader``)."""
        self.reader.check_position(pass_index, pos, document=document)

    @property
    def same_each_pass(self) -> bool:
        """Whether every pass hands this lane the same documents (see ``DocumentReader``)."""
        return self.reader.same_each_pass

    def get_state(self) -> dict[str, Any]:
        """Reader position and a copy of the filter state, checked to be plain JSON data
        (`plain_copy`): a filter may return (and go on updating) its live objects, while this
        state travels with a batch to a consumer that the packer runs ahead of (`prefetch`'s
        thread; a shuffle keeps it for a block)."""
        return {
            "reader": self.reader.get_state(),
            "filter": plain_copy(self.op.state_dict(), self.op),
            "rejected": self.rejected,
        }

    def next(self) -> Document:
        """The next kept document.

        Raises:
            DataError: under ``exhaustion="repeat"`` where each pass hands this lane the same
                documents (one lane, or no shuffling), when the filter rejects every document
                from one read position on, and its state, and the states of the filters beneath
                it, come back at that position, whole passes later, to what they were there
                before: the same decisions on the same documents would then go on for ever (a
                deduplicating filter once every document was seen; a filter whose state
                cycles). The position is looked at every pass (every two where passes come
                shuffled), against a state kept from 1, 2, 4, ... looks before, so a cycle of
                any length is found with one state held. Without shuffling that is a proof;
                with one shuffled lane, whose passes come in other orders, a filter whose
                state came back just then is refused though a later order might have kept a
                document.
        """
        rejected, rows = 0, self.reader.lane_rows
        filters, _ = self._stack()
        watch = rows > 0 and self.reader.exhaustion == "repeat" and self.same_each_pass
        apart = 2 if self.layout.shuffle else 1  # passes between two looks
        looks = _Looks()
        while True:
            doc: Document = next(self.reader)
            assert doc.tokens is not None
            if doc.error is not None:  # a bad row skipped: the packer counts it
                return doc
            if doc.tokens.dtype != np.int32:  # pre-tokenized ids come in their stored type
                doc.tokens = self._as_int32(doc)
            if self._keep(doc):
                return doc
            if self.on_rejected is not None:
                self.on_rejected()
            rejected += 1
            self.rejected += 1
            if rejected == 8 * rows and self.reader.exhaustion == "repeat":
                warn(  # where nothing proves it rejects for ever: a word at least
                    f"dataset {self.layout.name!r}: the stateful filter {filter_name(self.op)!r} "
                    f"rejected {rejected} documents in a row (eight passes of this lane)",
                )
            looking = watch and rejected >= rows and looks.due(doc.pass_index, doc.pos, apart)
            if looking and looks.seen_before(_states(filters)):
                raise DataError(
                    f"the stateful filter {filter_name(self.op)!r} rejected every document of "
                    "this lane for whole passes and came back to a state it had at the "
                    "same position: with exhaustion='repeat' it would read for ever "
                    "without keeping one",
                    dataset=self.layout.name,
                )

    def _keep(self, doc: Document) -> bool:
        """The filter's decision on ``doc``; its errors become a DataError naming the row."""
        names, paths = self.where
        what = f"stateful filter {filter_name(self.op)!r}"
        return call_user(
            lambda tokens: decision(self.op.keep(tokens, self.source_name), what),
            doc.tokens,
            doc,
            what,
            dataset_names=names,
            shard_paths=paths,
        )

    def _stack(self) -> tuple[list[FilteredReader], DocumentReader]:
        """This filtered reader and those beneath it, top first, and the reader at the bottom."""
        filters: list[FilteredReader] = []
        reader: Any = self
        while isinstance(reader, FilteredReader):
            filters.append(reader)
            reader = reader.reader
        return filters, reader

    def _as_int32(self, doc: Document) -> npt.NDArray[np.int32]:
        """The document's ids as int32, as filters always see them; ``DataError`` naming the
        document for an id outside ``[0, 2**31)`` (batches check the rest later)."""
        tokens = doc.tokens
        assert tokens is not None
        if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= 2**31):
            bad = int(tokens[(tokens < 0) | (tokens >= 2**31)][0])
            dataset = self.reader.runner.chain.datasets[doc.source]
            raise DataError(
                f"holds token id {bad}; ids must lie in [0, 2**31)",
                dataset=dataset.name,
                shard=dataset.shards[doc.shard].path,
                row=doc.row,
            )
        return tokens.astype(np.int32)

    def fetch(self, pass_index: int, pos: int) -> Document:
        """Re-read a document that was kept (no decision is made again)."""
        return self.reader.fetch(pass_index, pos)


class _Looks:
    """Where and what a filtered reader compares while it rejects (see ``FilteredReader.next``):
    a read position, looked at once a pass (or every ``apart`` passes), and a kept state that
    moves to the latest look after 1, 2, 4, ... looks (Brent's cycle finding)."""

    def __init__(self) -> None:
        self.position: int | None = None
        self.next_pass = 0
        self.looked = False
        self.kept: str | None = None
        self.since = 0  # looks since the kept state was taken
        self.span = 1  # looks after which the kept state moves on

    def due(self, pass_index: int, pos: int, apart: int) -> bool:
        """Whether the document at ``(pass_index, pos)`` is at a look (the first is)."""
        if self.position is None:
            self.position = pos
        if pos != self.position or pass_index < self.next_pass:
            return False
        self.next_pass = pass_index + apart
        return True

    def seen_before(self, state: str | None) -> bool:
        """Whether ``state`` (None: not comparable) equals the kept one; keeps it when due."""
        if self.looked and state is not None and state == self.kept:
            return True
        if not self.looked or self.since + 1 == self.span:
            if self.looked:
                self.span *= 2
            self.kept, self.since, self.looked = state, 0, True
        else:
            self.since += 1
        return False


def _states(filters: list[FilteredReader]) -> str | None:
    """The filters' states as JSON text: a copy, so a filter that keeps updating the dict it
    returns is compared by value. None for a state JSON cannot write (keys that are not strings
    or numbers): never judged equal."""
    try:
        return json.dumps([f.op.state_dict() for f in filters], default=_exact)
    except (TypeError, ValueError):
        return None


def _exact(value: Any) -> Any:
    """A JSON stand-in for a value ``json`` cannot write: arrays and numpy numbers in full
    (``repr`` would elide long arrays, making different states look equal)."""
    return value.tolist() if hasattr(value, "tolist") else repr(value)
