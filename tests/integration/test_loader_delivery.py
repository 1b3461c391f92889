"""The loader's delivered state: batches fetched ahead and not used, marks out of order, stale
iterators, an idle StatefulDataLoader worker, and a dataset shared with a plain torch loader
(a Lightning checkpoint taken with a batch fetched ahead: test_lightning.py)."""

from __future__ import annotations

import itertools
import json
import warnings
from typing import Any

import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from tests.helpers import small_pipeline, two_sources
from zephon_torch import ConfigError
from zephon_torch.torch import DataLoader

DATASETS = two_sources(40, 30, shard_size=8)


def build(tokenizer: Any, **kw: Any) -> Any:
    kw.setdefault("lanes", 4)
    kw.setdefault("datasets", DATASETS)
    kw.setdefault("exhaustion", "repeat")
    return small_pipeline(tokenizer, **kw)


def fingerprint(item: dict[str, Any]) -> bytes:
    return b"".join(item[k].numpy().tobytes() for k in ("input_ids", "labels", "position_ids"))


def take(loader: Any, n: int) -> list[bytes]:
    out = []
    for item in loader:
        out.append(fingerprint(item))
        if len(out) == n:
            break
    return out


def test_deliver_on_use_state_leaves_out_a_fetched_batch_not_yet_marked(tokenizer: Any) -> None:
    """Without workers the loader iterates the user's pipeline itself, whose lane states record
    what was *fetched*: a lane fetched ahead but never marked leaked into ``state_dict()``."""
    reference = take(DataLoader(build(tokenizer)), 8)
    loader = DataLoader(build(tokenizer), deliver_on_use=True)
    batches = iter(loader)
    first, _fetched_ahead = next(batches), next(batches)  # as Lightning does
    loader.mark_delivered(first)
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = DataLoader(build(tokenizer))
    resumed.load_state_dict(state)
    assert take(resumed, 5) == reference[1:6]


def test_deliver_on_use_iterated_again_continues_from_the_marked_batches(tokenizer: Any) -> None:
    reference = take(DataLoader(build(tokenizer)), 8)
    loader = DataLoader(build(tokenizer), deliver_on_use=True)
    batches = iter(loader)
    for _ in range(3):
        next(batches)  # fetched, never used
    del batches
    assert take(loader, 3) == reference[:3]


def test_marking_a_lane_s_older_batch_after_a_newer_one_does_not_move_the_state_back(
    tokenizer: Any,
) -> None:
    reference = take(DataLoader(build(tokenizer)), 12)
    loader = DataLoader(build(tokenizer), deliver_on_use=True)
    batches = iter(loader)
    fetched = [next(batches) for _ in range(8)]  # two turns of four lanes
    for batch in reversed(fetched):  # all used, marked in another order
        loader.mark_delivered(batch)
    resumed = DataLoader(build(tokenizer))
    resumed.load_state_dict(json.loads(json.dumps(loader.state_dict())))
    assert take(resumed, 4) == reference[8:12]


def test_an_iterator_made_before_load_state_dict_is_stale(tokenizer: Any) -> None:
    """As for a pipeline: the old iterator must not go on with the pre-load stream and record
    its lane states over the loaded ones."""
    reference = take(DataLoader(build(tokenizer)), 12)
    loader = DataLoader(build(tokenizer))
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    saved = loader.state_dict()
    for _ in range(3):
        next(batches)
    loader.load_state_dict(saved)
    with pytest.raises(RuntimeError, match="stale"):
        next(batches)
    assert loader.state_dict() == saved
    assert take(loader, 6) == reference[3:9]


@pytest.mark.parametrize("workers", [0, 2])
def test_an_iterator_made_before_another_iter_is_stale(tokenizer: Any, workers: int) -> None:
    """Both iterators ran and marked their batches as delivered (without workers, until the
    newer one took its first batch): the state then named neither stream's position."""
    reference = take(DataLoader(build(tokenizer)), 10)
    options = {"multiprocessing_context": "fork"} if workers else {}
    loader = DataLoader(build(tokenizer), num_workers=workers, **options)
    first = iter(loader)
    got = [fingerprint(next(first)) for _ in range(3)]
    second = iter(loader)
    with pytest.raises(RuntimeError, match="stale"):
        next(first)
    got += [fingerprint(next(second)) for _ in range(3)]
    assert got == reference[:6]
    resumed = DataLoader(build(tokenizer))
    resumed.load_state_dict(json.loads(json.dumps(loader.state_dict())))
    assert take(resumed, 4) == reference[6:10]


def test_stateful_dataloader_with_an_idle_worker_saves_and_resumes(tokenizer: Any) -> None:
    """3 workers over 4 lanes: one idle worker (warned about, supported); its state holds no
    lanes, and computing its ``step`` crashed with ``min() arg is an empty sequence``."""

    def loader() -> StatefulDataLoader:
        return StatefulDataLoader(
            build(tokenizer).to_torch(),
            batch_size=None,
            num_workers=3,
            multiprocessing_context="fork",
        )

    reference = take(DataLoader(build(tokenizer)), 10)
    first = loader()
    assert take(first, 5) == reference[:5]
    second = loader()
    second.load_state_dict(first.state_dict())
    assert take(second, 5) == reference[5:10]


def test_prefetch_factor_is_accepted_when_the_worker_count_is_set_to_zero(tokenizer: Any) -> None:
    """num_workers is a performance knob: a job resumed with 0 workers must not fail on the
    prefetch_factor it kept (multiprocessing_context is already accepted that way)."""
    loader = DataLoader(build(tokenizer), num_workers=0, prefetch_factor=4)
    assert take(loader, 2) == take(DataLoader(build(tokenizer)), 2)


def test_a_plain_loader_over_a_dataset_a_zephon_loader_used_gets_plain_training_dicts(
    tokenizer: Any,
) -> None:
    """The zephon loader set ``with_meta`` (and, with workers, the packed transport) on the
    caller's dataset for good: a plain torch loader over it then handed the model a
    ``"zephon"`` entry (or a packed buffer instead of tensors)."""
    dataset = build(tokenizer).to_torch()
    next(iter(DataLoader(dataset)))
    plain = torch.utils.data.DataLoader(dataset, batch_size=None)
    assert "zephon" not in next(iter(plain))


# Python 3.12+ warns at each fork of a process with threads: here torch's and tokenizers'
# native ones, not zephon_torch's (a "fork" worker is the test's choice)
FORKED_WITH_THREADS = r"This process \(pid=\d+\) is multi-threaded"


@pytest.mark.parametrize("workers", [0, 1, 2])  # one worker's warning stayed in the worker
@pytest.mark.parametrize("rows", [(6, 4), (40, 30)])
def test_iterating_a_spent_loader_again_warns_once(
    tokenizer: Any, workers: int, rows: tuple[int, int], capfd: pytest.CaptureFixture[str]
) -> None:
    pipeline = build(tokenizer, exhaustion="stop", datasets=two_sources(*rows, shard_size=3))
    loader = DataLoader(pipeline, num_workers=workers, multiprocessing_context="fork")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", "dataset 'short' ran out")  # (of the mixture)
        warnings.filterwarnings("ignore", FORKED_WITH_THREADS, DeprecationWarning)
        assert take(loader, 10_000)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", FORKED_WITH_THREADS, DeprecationWarning)
        again = [item["num_valid_tokens"] for item in loader]
    assert len(caught) == 1 and "every lane of this pipeline is spent" in str(caught[0].message)
    assert sum(again) == 0
    assert "gave no data" not in capfd.readouterr().err  # nor once more by a worker


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_warning_every_worker_gives_comes_once_from_the_main_process(
    tokenizer: Any, context: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """Each worker printed its own copy of a warning about the data (here: a source that ran
    out mid-run, in every lane), one per worker per rank, and none that the main process's
    filters or `pytest.warns` could see."""
    pipeline = build(tokenizer, exhaustion="stop", datasets=two_sources(40, 30, shard_size=3))
    with pytest.warns(UserWarning, match="dataset 'short' ran out"):  # once, in process
        in_process = [
            fingerprint(item)
            for item in DataLoader(
                build(tokenizer, exhaustion="stop", datasets=two_sources(40, 30, shard_size=3))
            )
        ]
    loader = DataLoader(pipeline, num_workers=2, multiprocessing_context=context)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        assert [fingerprint(item) for item in loader] == in_process
    said = [str(w.message) for w in caught if "ran out" in str(w.message)]
    assert len(said) == 1 and said[0].startswith("dataset 'short' ran out (exhaustion='stop'")
    # from the line that iterates the loader, not the library's line in the worker (a trial)
    assert [w.filename for w in caught if "ran out" in str(w.message)] == [__file__]
    assert "ran out" not in capfd.readouterr().err  # no worker printed it


@pytest.mark.parametrize("num_workers", [0, 2])
def test_to_torch_gives_the_attention_mask_the_readme_advises_for_sdpa(
    tokenizer: Any, num_workers: int
) -> None:
    """The README advises `attention_mask=True` with sdpa for batches of several rows, but
    only `Batch.to_training` took it: no loader item could carry the mask."""
    batches = list(itertools.islice(build(tokenizer), 6))
    dataset = build(tokenizer).to_torch(attention_mask=True, mask_document_boundaries=True)
    items = list(itertools.islice(DataLoader(dataset, num_workers=num_workers), 6))
    for batch, item in zip(batches, items, strict=True):
        want = batch.to_training(attention_mask=True, mask_document_boundaries=True)
        assert item["attention_mask"].dtype == torch.bool
        assert item["attention_mask"].shape == (2, 1, 64, 64)
        assert torch.equal(item["attention_mask"], want["attention_mask"])
        assert torch.equal(item["labels"], want["labels"])
    assert "attention_mask" not in next(iter(DataLoader(build(tokenizer))))
    with pytest.raises(ConfigError, match="`attention_mask` must be True or False"):
        build(tokenizer).to_torch(attention_mask="yes")  # type: ignore[arg-type]
