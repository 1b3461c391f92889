"""Proof that a source under ``exhaustion="repeat"`` would be read for ever without a token.

A lane's reader (of the filters' drops) and its packer (of documents that gave no tokens)
each keep a ``BarrenRun`` per source: a run of documents in a row that gave nothing, which
proves a source barren once it covers a whole pass, or gives up on it after
``GIVE_UP_PASSES`` lane passes where no proof can come.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from zephon_torch._caller import warn
from zephon_torch.errors import DataError

GIVE_UP_PASSES = 256  # lane passes without a token after which a repeating source is refused


def gave_up_error(reader: Any, dry: int) -> DataError:
    """The ``DataError`` of a source that went ``GIVE_UP_PASSES`` passes of a lane without
    giving it anything (``BarrenRun.given_up``)."""
    return DataError(
        f"gave lane {reader.lane} nothing in {GIVE_UP_PASSES} passes of it ({dry} documents "
        "in a row: empty, dropped by the filters or the length rules, or rejected by a "
        "stateful filter): with exhaustion='repeat' it would be read for ever. Check the "
        "filters and rules, or the lane's share of the dataset (a few documents dealt over "
        "many lanes may leave a lane only empty ones)",
        dataset=reader.layout.name,
    )


class BarrenRun:
    """A run of one lane's documents of one source, in a row, that gave nothing (empty, cut by
    the length rules, or dropped by the filters: all pure functions of the row).

    Under ``exhaustion="repeat"`` a source none of whose documents ever gives anything would be
    read for ever; the run proves it (``extend``):

    - where every pass hands the lane the same documents (one lane, or no shuffle), once it
      holds twice a lane pass, hence a whole pass;
    - with several shuffled lanes, where each pass deals the documents anew, once it has met
      every row of the dataset (counted from the third lane pass on, a flag per row).

    A warning names the source after eight lane passes, as the proof may take many passes.
    Where no proof can come (a lane whose positions never reach the rows that give tokens, as
    a shuffle window of one shard may deal them; a stateful filter's rejections, which end
    the run as no pure fact of the row), ``given_up`` says so once the source has gone
    ``GIVE_UP_PASSES`` lane passes without a token: a lane that read on would never yield.

    Args:
        what: what befell the documents, for the warning ("were dropped by the filters").
    """

    def __init__(self, what: str) -> None:
        self.what = what  # no reader kept: the reader holds its run, a cycle would hold both
        self.clear()

    def clear(self) -> None:
        """End the run: a document gave something."""
        self.restart()
        self.dry = 0  # documents read since the source last gave something

    def restart(self) -> None:
        """End the run's proof, not its dry spell: a document was rejected for no pure
        reason of the row (a stateful filter's)."""
        self.length = 0
        self._met: npt.NDArray[np.bool_] | None = None  # the rows met, from the third pass
        self._count = 0

    def given_up(self, reader: Any, added: int = 0) -> bool:
        """Count ``added`` more documents of the dry spell; True once it has lasted
        ``GIVE_UP_PASSES`` passes of the lane under ``exhaustion="repeat"``."""
        self.dry += added
        rows = reader.lane_rows
        return bool(reader.exhaustion == "repeat" and 0 < GIVE_UP_PASSES * rows < self.dry)

    def extend(self, reader: Any, shards: Any, rows: Any) -> bool:
        """Add the documents stored at ``(shards, rows)`` (arrays, or one of each) to the run;
        True once it proves that the source gives nothing for ever. ``reader``: the lane's
        reader of the source (its layout, lane pass and policy). Counts them in the dry spell
        too (``given_up``)."""
        added = int(np.size(rows))
        self.dry += added
        self.length += added
        lane_rows = reader.lane_rows
        if reader.exhaustion != "repeat" or self.length <= 2 * lane_rows:
            return False
        if self.length - added <= 8 * lane_rows < self.length:
            warn(
                f"dataset {reader.layout.name!r}: {self.length} documents in a row {self.what}",
            )
        if reader.same_each_pass:
            return True
        layout = reader.layout
        if self._met is None:
            self._met = np.zeros(layout.num_rows, dtype=np.bool_)
            self._firsts = np.cumsum((0, *layout.shard_rows))
        index = self._firsts[shards] + rows
        self._count += int(np.count_nonzero(~self._met[index]))  # a span has no row twice
        self._met[index] = True
        return bool(self._count == layout.num_rows)
