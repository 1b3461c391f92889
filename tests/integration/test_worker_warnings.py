"""Warnings of zephon_torch's DataLoader workers reach the main process once, where its own
filters decide (see `zephon_torch/torch/_warnings.py`); a worker that ends without another item
prints what it still holds."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from tests.helpers import small_pipeline, two_sources
from zephon_torch import Pipeline
from zephon_torch.errors import DataError
from zephon_torch.io import Dataset
from zephon_torch.torch import DataLoader
from zephon_torch.torch._warnings import heard_warnings
from zephon_torch.work import StaticMixtureWorkSource


class OddRow(DeprecationWarning):
    """A warning category of this module: arrives as itself."""


def warn_then_refuse_row_five(row: dict[str, Any]) -> dict[str, Any]:
    """Warns of every row (a DeprecationWarning, which a worker's default filters drop),
    and refuses row 5."""
    warnings.warn(f"row {row['n']} looks odd", OddRow, stacklevel=1)
    if row["n"] == 5:
        raise ValueError("row 5 is refused")
    return row


def _warning_pipeline(lanes: int = 1) -> Pipeline:
    data = Dataset.from_dict("d", {"ids": [[1, 2, 3]] * 8, "n": list(range(8))}, shard_size=4)
    source = StaticMixtureWorkSource([data], shuffle=False)
    recipe = Pipeline(source).options(canonical_replicas=lanes).map(warn_then_refuse_row_five)
    return recipe.pretokenized("ids").pack_flat(8).batch(1)


def test_a_worker_s_warnings_come_with_its_error_to_the_main_process_s_filters(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A DeprecationWarning a spawned worker's default filters dropped, heard before the
    error that ended the worker: given in the main process, as its category, from the map's
    line and module (so a filter by module applies)."""
    loader = DataLoader(_warning_pipeline(), num_workers=1, multiprocessing_context="spawn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", message="row 3", module=__name__)
        with pytest.raises(DataError, match="raised ValueError"):
            list(loader)
    said = [(w.category, str(w.message)) for w in caught if "looks odd" in str(w.message)]
    assert said == [(OddRow, f"row {n} looks odd") for n in (0, 1, 2, 4, 5)]
    assert all(w.filename == __file__ for w in caught if "looks odd" in str(w.message))
    assert "looks odd" not in capfd.readouterr().err  # the worker printed none of them


def test_a_worker_shows_what_it_heard_where_it_ends_without_another_item() -> None:
    """Held for the next item, a warning heard just before the worker failed (an error not
    of zephon_torch's, a shutdown) was lost with it; now the worker shows it itself (its
    stderr, through `warnings.showwarning`)."""
    with (
        warnings.catch_warnings(record=True) as shown,
        pytest.raises(RuntimeError, match="gone"),
        heard_warnings(True) as heard,
    ):
        assert heard is not None
        for number in range(2):
            warnings.warn("sent already", UserWarning, stacklevel=1)  # the same, once
            if number == 0:
                warnings.warn("the cache is too small", UserWarning, stacklevel=1)
                assert [text for _, text, *_ in heard.take()] == [
                    "sent already",
                    "the cache is too small",
                ]
        warnings.warn("the last words", UserWarning, stacklevel=1)
        raise RuntimeError("gone")
    assert [str(w.message) for w in shown] == ["the last words"]


def test_a_category_defined_in_a_function_arrives_as_a_user_warning() -> None:
    class Local(UserWarning):
        pass

    with heard_warnings(True) as heard:
        assert heard is not None
        warnings.warn("local", Local, stacklevel=1)
        warnings.warn("kept", OddRow, stacklevel=1)
        taken = heard.take()
    assert [(category, text) for category, text, *_ in taken] == [
        (UserWarning, "local"),
        (OddRow, "kept"),
    ]
    assert {module for _, _, _, _, module, _ in taken} == {__name__}


def test_the_idle_workers_warning_comes_from_the_main_process(
    tokenizer: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    """Given as the loader is made, at the user's line (it came from a worker, named as torch's
    fetch code, once the workers started: review N, finding 3), and not again from them."""
    import warnings

    pipeline = small_pipeline(tokenizer, lanes=4, datasets=two_sources(20, 10, shard_size=4))
    with warnings.catch_warnings(record=True) as heard:
        warnings.simplefilter("always")
        loader = DataLoader(pipeline, num_workers=3, multiprocessing_context="fork")
        next(iter(loader))
    said = [w for w in heard if "cannot be split evenly" in str(w.message)]
    assert [w.filename for w in said] == [__file__]
    assert "4 lanes on this rank cannot be split evenly over 3" in str(said[0].message)
    assert "cannot be split evenly" not in capfd.readouterr().err


def test_the_idle_workers_warning_counts_the_lanes_the_rank_holds_when_it_runs(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loader made before the process group (torch.multiprocessing.spawn) counted all the
    lanes: 4 lanes over 4 workers, no warning, where each of 2 ranks holds 2 (review D3, 1)."""
    import warnings

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    pipeline = small_pipeline(tokenizer, lanes=4, datasets=two_sources(20, 10, shard_size=4))
    with warnings.catch_warnings(record=True) as heard:
        warnings.simplefilter("always")
        loader = DataLoader(pipeline, num_workers=4, multiprocessing_context="fork")
        monkeypatch.setenv("RANK", "1")  # as the process group, made after the loader
        monkeypatch.setenv("WORLD_SIZE", "2")
        for _ in range(2):  # once per loader
            next(iter(loader))
    said = [str(w.message) for w in heard if "cannot be split evenly" in str(w.message)]
    assert said == [
        "2 lanes on this rank cannot be split evenly over 4 DataLoader workers; using 2 of "
        "them (the rest stay idle). Pick a num_workers that divides the lanes per rank."
    ]


class _ImportsWhenCollected:
    """Garbage whose finalizer adds a module, as another thread's import would meanwhile, and
    leaves such garbage for the next collection (``left`` times)."""

    left = 0

    def __init__(self) -> None:
        self.cycle = self

    def __del__(self) -> None:
        import sys
        import types

        sys.modules[f"_zephon_test_{id(self)}"] = types.ModuleType("added")
        if _ImportsWhenCollected.left > 0:
            _ImportsWhenCollected.left -= 1
            _ImportsWhenCollected()


def test_a_worker_s_warning_is_sent_while_modules_are_imported_meanwhile() -> None:
    """A worker listed `sys.modules` item by item to name a warning's module: a collection
    during that listing could run a finalizer that imports (another thread could too), and
    the worker died of "dictionary changed size during iteration" (a CI run)."""
    import gc
    import sys

    with heard_warnings(True) as heard:
        assert heard is not None
        warnings.warn("odd", OddRow, stacklevel=1)
        threshold = gc.get_threshold()
        gc.collect()
        try:
            _ImportsWhenCollected.left = 10_000
            _ImportsWhenCollected()  # garbage, for the next collection
            gc.set_threshold(1)  # a collection at each allocation
            taken = heard.take()
        finally:
            gc.set_threshold(*threshold)
            _ImportsWhenCollected.left = 0
            gc.collect()
            for name in [n for n in sys.modules if n.startswith("_zephon_test_")]:
                del sys.modules[name]
    assert [(text, module) for _, text, _, _, module, _ in taken] == [("odd", __name__)]


def refuse_every_fourth_row(row: dict[str, Any]) -> dict[str, Any]:
    if row["n"] % 4 == 1:
        raise ValueError(f"row {row['n']} is refused")
    return row


@pytest.mark.parametrize("num_workers", [0, 2])
def test_skipped_rows_are_warned_of_once_a_dataset_and_iteration_with_any_workers(
    num_workers: int,
) -> None:
    """Each worker skipped rows of its own lanes and warned of the first it met, each naming
    another row: the main process gave one warning per worker, where the README promises one
    per dataset and iteration, as without workers."""
    data = Dataset.from_dict("d", {"ids": [[1, 2, 3]] * 64, "n": list(range(64))}, shard_size=4)
    source = StaticMixtureWorkSource([data], seed=3)
    recipe = Pipeline(source).options(canonical_replicas=4, bad_rows="skip")
    recipe = recipe.map(refuse_every_fourth_row).pretokenized("ids").pack_flat(8).batch(1)
    loader = DataLoader(recipe, num_workers=num_workers, multiprocessing_context="fork")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert len(list(loader)) > 0
    said = [str(w.message) for w in caught if "skipping rows that raise" in str(w.message)]
    assert len(said) == 1, said
    assert loader.stats()["skipped_documents"]["malformed"] == 16
