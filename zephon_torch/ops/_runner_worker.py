"""What a process of ``runner="processes"`` runs: its start-up (the fused chain read once from
its file; Ctrl-C and SIGTERM left to the parent; an end once the parent has gone) and each task
(a span of pointers in, the chunk out, pickled here), and the process class the pool starts
them with (blocking both signals until a process can ignore them; ended by SIGKILL).
"""

from __future__ import annotations

import contextlib
import multiprocessing.context
import os
import pickle
import signal
import threading
import time
from collections.abc import Iterator

from zephon_torch.errors import ConfigError, DataError, ZephonError
from zephon_torch.ops._doc_chain import DocChain
from zephon_torch.ops.columns import TokenChain, TokenChunk
from zephon_torch.ops.document import Document
from zephon_torch.work.pointers import PointerSpan

Chunk = list[Document] | TokenChunk  # a chain's documents for one span, in stream order

_PARENT_POLL_S = 1.0  # how soon a worker whose parent was killed ends


Chain = DocChain | TokenChain
_WORKER_CHAIN: Chain | None = None
_WORKER_LOAD_ERROR: ConfigError | None = None  # why this worker could not load its chain


LEFT_TO_PARENT = {signal.SIGINT, signal.SIGTERM}  # a worker ignores them (`init_worker`)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM blocked in this thread meanwhile: a process started meanwhile starts
    with them blocked (spawn's fork and exec keep the mask) until it can take or ignore them."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, LEFT_TO_PARENT)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def init_worker(path: str, parent: int) -> None:
    global _WORKER_CHAIN, _WORKER_LOAD_ERROR  # noqa: PLW0603 - one chain per worker process
    # Ctrl-C, and a scheduler's SIGTERM before its SIGKILL (Slurm's preemption), reach the
    # whole process group; they are the parent's to act on (a loop may take them as "stop
    # after the next checkpoint" and go on). Each worker printed its own KeyboardInterrupt
    # traceback, or died of SIGTERM, and the next chunk broke the pool; a parent that leaves
    # ends them (`_runner._end_at_exit`, `_end_with`), by SIGKILL
    for signum in LEFT_TO_PARENT:
        signal.signal(signum, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, LEFT_TO_PARENT)  # held back until now
    # the parent's pid from the parent: read here, after seconds of start-up, it is already
    # init's (1) where the parent was killed meanwhile, and the watch below never fired
    threading.Thread(target=_end_with, args=(parent,), daemon=True, name="zephon-parent").start()
    try:
        with open(path, "rb") as handle:
            _WORKER_CHAIN = pickle.load(handle)
    except FileNotFoundError:  # the runner closed before this process started: no task comes
        pass
    except (AttributeError, ImportError) as error:  # a function this process cannot find
        # told to each task, not raised: a failed initializer breaks the pool, whose error
        # could only guess (a missing main guard) at what a process printed
        _WORKER_LOAD_ERROR = _unloadable(error)


def _unloadable(error: Exception) -> ConfigError:
    """The error of a worker that could not unpickle its chain (``error``): a function or
    class it names that the spawned process cannot import."""
    failure = ConfigError(
        "the processes of runner='processes' could not load the pipeline's functions: "
        f"{error}. They are spawned and import each function by its module and name; one of "
        "the main script is found only where the script defines it at its top level, not "
        'under `if __name__ == "__main__":`, inside a function or in code run by exec: '
        "define it there, or in a module of its own, or use runner='threads'"
    )
    failure.__cause__ = error
    return failure


class _WorkerProcess(multiprocessing.context.SpawnProcess):
    """A pool process, ended by SIGKILL: it ignores SIGTERM (see `init_worker`), and the pool
    (a broken one, as `PoolWatch` and `_runner._terminate` too) terminates its processes, then
    waits for them to end."""

    def start(self) -> None:
        """Start it with Ctrl-C and SIGTERM blocked, as `init_worker` unblocks them: a group
        signal in its seconds of imports before then killed it, and the pool broke."""
        with signals_held():
            super().start()

    def terminate(self) -> None:
        self.kill()


class SpawnContext(multiprocessing.context.SpawnContext):
    Process = _WorkerProcess


def _end_with(parent: int) -> None:
    """End this worker once its parent has gone: a parent killed by SIGKILL (the out-of-memory
    killer) closes no pool, and its workers waited for a task for ever, orphaned."""
    while os.getppid() == parent:
        time.sleep(_PARENT_POLL_S)
    os._exit(1)


class Raised:
    """A worker's zephon_torch error, returned as a value: raised, the pool would replace its
    cause (the user's exception, see `ZephonError`) with the pool's own traceback text."""

    def __init__(self, error: ZephonError) -> None:
        self.error = error


def run_in_worker(source: int, span: PointerSpan) -> bytes:
    """The chunk, or the zephon_torch error it raised, pickled here by the standard pickler.
    Left to the pool, multiprocessing's pickler would send it, on which torch registers
    reductions that pass each tensor as a shared-memory file descriptor: the parent held one
    open per tensor read ahead (thousands), and past `ulimit -n` the pool broke."""
    if _WORKER_LOAD_ERROR is not None:
        return pickle.dumps(Raised(_WORKER_LOAD_ERROR), protocol=5)
    if _WORKER_CHAIN is None:
        raise RuntimeError("worker process was started without its document chain")
    try:
        outcome: Chunk | Raised = _WORKER_CHAIN(source, span)
    except ZephonError as error:
        outcome = Raised(error)
    try:
        return pickle.dumps(outcome, protocol=5)
    except Exception:
        found = None
        if isinstance(_WORKER_CHAIN, DocChain) and isinstance(outcome, list):
            found = _unpicklable(_WORKER_CHAIN, outcome)
        if found is None:
            raise
        return pickle.dumps(Raised(found), protocol=5)


def _unpicklable(chain: DocChain, docs: list[Document]) -> DataError | None:
    """A DataError naming the first of ``docs`` that holds a value pickle cannot take (one a
    map returned: a memoryview, an open file), and its field; None where none does."""
    for doc in docs:
        for kind, values in (("payload field", doc.payload), ("field", doc.data)):
            for name, value in (values or {}).items():
                try:
                    pickle.dumps(value, protocol=5)
                except Exception as error:
                    dataset = chain.datasets[doc.source]
                    found = DataError(
                        f"{kind} {name!r} holds a {type(value).__name__}, which pickle cannot "
                        f"take ({error}): with runner='processes' the values a map returns "
                        "must be picklable, to come back from its worker process",
                        dataset=dataset.name,
                        shard=dataset.shards[doc.shard].path,
                        row=doc.row,
                    )
                    found.__cause__ = error
                    return found
    return None
