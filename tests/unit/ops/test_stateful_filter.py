"""User stateful filters: each lane's documents seen and dropped as decided, a state checked
as plain JSON, and a user's mistakes (a factory, a decision, a state) named with filter and row."""

from __future__ import annotations

import importlib.util
import itertools
import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from tests.helpers import (
    Warmup,
    assert_resumes_at_every_step,
    not_five,
    repeating_pipeline,
    small_pipeline,
    two_sources,
)
from zephon_torch import ConfigError
from zephon_torch.ops.stateful import StatefulFilter

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "curriculum_filter.py"


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("curriculum_filter", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class EveryOther(StatefulFilter):
    name = "every_other"

    def __init__(self) -> None:
        self.count = 0

    def keep(self, tokens: npt.NDArray[Any], source: str) -> bool:
        self.count += 1
        return self.count % 2 == 1

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = state["count"]


def test_the_curriculum_example_limits_early_documents_and_resumes_exactly(tokenizer: Any) -> None:
    curriculum = load_example().LengthCurriculum

    def build() -> Any:
        base = small_pipeline(tokenizer, lanes=2, datasets=two_sources(20, 16, shard_size=5))
        return base.stateful_filter(lambda lane: curriculum(start=60, growth=20))

    n = assert_resumes_at_every_step(build)
    assert n >= 4
    pipeline = build()
    first = next(iter(pipeline))
    assert first.num_tokens > 0
    lane_state = pipeline.state_dict()["lanes"]["0"]["pack"]["readers"][0]
    assert lane_state["filter"]["seen"] > 0


def test_a_stateful_filter_sees_each_lanes_documents_and_drops_what_it_rejects(
    tokenizer: Any,
) -> None:
    datasets = two_sources(20, 16, shard_size=5)
    everything = sum(b.num_tokens for b in small_pipeline(tokenizer, datasets=datasets))
    half = small_pipeline(tokenizer, datasets=datasets).stateful_filter(lambda lane: EveryOther())
    kept = sum(b.num_tokens for b in half)
    assert 0 < kept < everything
    assert half.fingerprint()["stateful_filters"] == ["every_other"]


def test_a_factory_returning_something_else_is_refused(tokenizer: Any) -> None:
    with pytest.raises(ConfigError, match="must return a StatefulFilter, got int"):
        small_pipeline(tokenizer).stateful_filter(lambda lane: 3)  # type: ignore[arg-type,return-value]


class Stateless(StatefulFilter):
    """A filter that keeps no state (its decisions depend on the document alone)."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class Recorder(Stateless):
    name = "recorder"

    def __init__(self) -> None:
        self.seen: list[tuple[str, list[int]]] = []

    def keep(self, tokens: npt.NDArray[Any], source: str) -> bool:
        self.seen.append((str(tokens.dtype), tokens.tolist()))
        return True


def test_a_filter_sees_pre_tokenized_ids_as_int32_whatever_their_stored_type() -> None:
    import numpy as np

    from zephon_torch import DataError, Pipeline
    from zephon_torch.io import Dataset
    from zephon_torch.work import StaticMixtureWorkSource

    def pipeline(ids: list[Any]) -> Any:
        source = StaticMixtureWorkSource([Dataset.from_dict("d", {"ids": ids})], shuffle=False)
        return Pipeline(source).pretokenized("ids").pack_flat(4)

    recorder = Recorder()
    stored = [np.array([1, 2], dtype=np.uint64), np.array([3], dtype=np.uint16)]
    list(pipeline(stored).stateful_filter(lambda lane: recorder).batch(1))
    assert recorder.seen == [("int32", [1, 2]), ("int32", [3])]
    wide = [np.array([1], dtype=np.int64), np.array([2, 2**40], dtype=np.int64)]
    with pytest.raises(DataError, match=rf"row 1: holds token id {2**40}; ids must lie in"):
        list(pipeline(wide).stateful_filter(lambda lane: Recorder()).batch(1))


class Holding(Warmup):
    """A warm-up whose state holds ``value`` beside its count, from the document ``when``."""

    name = "holding"

    def __init__(self, value: Any, when: int = 0) -> None:
        super().__init__(skip=0)
        self.value, self.when = value, when

    def state_dict(self) -> dict[Any, Any]:
        held = self.value if self.state["seen"] >= self.when else None
        return {"seen": self.state["seen"], "held": held}


class _Thing:
    pass


@pytest.mark.parametrize(
    ("value", "where", "what"),
    [
        ({1, 2}, "['held']", "a builtins.set"),
        ((1, 2), "['held']", "a builtins.tuple"),
        ({("seen", 0): 1}, "['held'][('seen', 0)]", "a key of type tuple"),
        ({7: 1}, "['held'][7]", "a key of type int"),
        ([b"x"], "['held'][0]", "a builtins.bytes"),
        (np.arange(3), "['held']", "a numpy.ndarray"),
        (threading.Lock(), "['held']", "a _thread.lock"),
        (
            {"deep": [_Thing()]},
            "['held']['deep'][0]",
            "a tests.unit.ops.test_stateful_filter._Thing",
        ),
    ],
)
@pytest.mark.parametrize("when", [0, 2])
def test_a_state_that_is_not_plain_json_is_refused_naming_the_filter(
    value: Any, where: str, what: str, when: int
) -> None:
    """It was handed out, to fail in the user's `json.dump` naming neither the filter nor the
    key (a set, bytes), or to come back changed from JSON (a tuple, an int key), or as a bare
    "cannot pickle" TypeError (a lock) (review H, F5). Refused from the first state on, and
    from a later one that starts holding it."""
    pipeline = repeating_pipeline(4).stateful_filter(lambda lane: Holding(value, when)).batch(1)
    with pytest.raises(ConfigError) as caught:
        list(itertools.islice(pipeline, 4))
    assert str(caught.value) == (
        "stateful filter 'holding': its state_dict() must be plain JSON data (dicts with string "
        "keys, lists, str, int, float, bool, None), which a checkpoint saves and a resume gives "
        f"back as it was; state{where} holds {what}"
    )


def test_numpy_numbers_in_a_state_are_saved_as_plain_numbers() -> None:
    """A counter updated with numpy (np.int64) made a state `json.dumps` refused."""
    value = {"count": np.int64(5), "mean": np.float32(0.5), "flag": np.bool_(True)}
    pipeline = repeating_pipeline(4).stateful_filter(lambda lane: Holding(value)).batch(1)
    list(itertools.islice(pipeline, 2))
    state = pipeline.state_dict()
    held = state["lanes"]["0"]["pack"]["readers"][0]["filter"]["held"]
    assert held == {"count": 5, "mean": 0.5, "flag": True}
    assert [type(v) for v in held.values()] == [int, float, bool]
    json.dumps(state)


class Raises(Stateless):
    name = "raises"

    def keep(self, tokens: npt.NDArray[Any], source: str) -> bool:
        if len(tokens) and tokens[0] == 4:
            raise KeyError("boom")
        return True


def test_errors_of_a_user_filter_s_decision_name_the_row() -> None:
    """A stateful filter's exception, and a plain filter's result with no truth value, came
    out bare, naming no row."""
    from zephon_torch import DataError

    pipeline = repeating_pipeline(6).stateful_filter(lambda lane: Raises()).batch(1)
    with pytest.raises(DataError, match=r"dataset 'd', shard .*, row 3: stateful filter 'raises'"):
        list(itertools.islice(pipeline, 12))

    import numpy as np

    from zephon_torch import Pipeline
    from zephon_torch.io import Dataset
    from zephon_torch.work import StaticMixtureWorkSource

    dataset = Dataset.from_dict("t", {"ids": [[1, 2], [3, 4]]})
    plain = (
        Pipeline(StaticMixtureWorkSource([dataset]))
        .filter(lambda row: np.array([True, False]), name="array")
        .pretokenized("ids")
        .pack_flat(4)
        .batch(1)
    )
    with pytest.raises(DataError, match=r"row 0: filter 'array' raised ValueError: The truth"):
        next(iter(plain))


class Forgets(Stateless):
    """Returns nothing (a missed `return`) from its first call on."""

    name = "forgets"

    def keep(self, tokens: npt.NDArray[Any], source: str) -> bool:
        return None  # type: ignore[return-value]


def test_a_filter_that_returns_no_decision_is_refused_naming_the_row() -> None:
    """A filter that returned None (a missed `return`) dropped every document, and one that
    returned a function (a predicate not called) kept every one, without a word (fresh-user
    trials); other results still count by their truth value, as Python's `filter` reads
    them."""
    import numpy as np

    from zephon_torch import DataError, Pipeline
    from zephon_torch.io import Dataset
    from zephon_torch.work import StaticMixtureWorkSource

    def first_ids(fn: Any, name: str) -> list[int]:
        dataset = Dataset.from_dict("t", {"ids": [[1, 2], [3, 4], [5, 6]]})
        pipeline = Pipeline(StaticMixtureWorkSource([dataset], shuffle=False))
        pipeline = pipeline.filter(fn, name=name).pretokenized("ids").pack_flat(2).batch(1)
        return [int(batch.input_ids[0, 0]) for batch in pipeline]

    for fn, got in ((lambda row: None, "None"), (lambda row: not_five, "a callable")):
        with pytest.raises(DataError, match=rf"dataset 't', .* row 0: filter 'f' returned {got}"):
            first_ids(fn, "f")
    assert first_ids(lambda row: np.int64(row["ids"][0] - 3), "int") == [1, 5]
    assert first_ids(lambda row: np.bool_(row["ids"][0] > 1), "numpy") == [3, 5]
    assert first_ids(lambda row: "" if row["ids"][0] == 5 else "x", "text") == [1, 3]

    pipeline = repeating_pipeline(6).stateful_filter(lambda lane: Forgets()).batch(1)
    with pytest.raises(DataError, match=r"row \d+: stateful filter 'forgets' returned None"):
        next(iter(pipeline))


class MisreadsItsState(EveryOther):
    """EveryOther whose ``load_state_dict`` reads a key its state does not hold."""

    name = "misreads"

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = state["seen"]


def test_a_factory_s_shared_instance_and_its_errors_are_named_with_filter_and_lane() -> None:
    """One instance for every lane was taken, and its decisions then changed with the world
    size; a factory's exception, and one from `load_state_dict` (called as every iteration
    starts, even with no state loaded), came out bare (fresh-user trial C)."""
    from zephon_torch import ConfigError, Pipeline
    from zephon_torch.io import Dataset
    from zephon_torch.work import StaticMixtureWorkSource

    dataset = Dataset.from_dict("d", {"ids": [[i + 1] * 3 for i in range(16)]})
    recipe = (
        Pipeline(StaticMixtureWorkSource([dataset]))
        .options(canonical_replicas=2)
        .pretokenized("ids")
    )
    shared = Recorder()
    pipeline = recipe.stateful_filter(lambda lane: shared).pack_flat(3).batch(1)
    with pytest.raises(ConfigError, match=r"'recorder': its factory returned an instance it had"):
        next(iter(pipeline))

    def fails_for_lane_one(lane: int) -> StatefulFilter:
        if lane == 1:
            raise RuntimeError("cannot build for this lane")
        return Recorder()

    pipeline = recipe.stateful_filter(fails_for_lane_one).pack_flat(3).batch(1)
    with pytest.raises(ConfigError, match=r"factory raised RuntimeError for lane 1: cannot build"):
        next(iter(pipeline))
    pipeline = recipe.stateful_filter(lambda lane: MisreadsItsState()).pack_flat(3).batch(1)
    with pytest.raises(
        ConfigError, match=r"'misreads' of lane 0, dataset 'd': its load_state_dict raised KeyError"
    ):
        next(iter(pipeline))
