"""User functions (maps, filters, stateful filters, partials, callable objects, lambdas) are
named alike in every process: in errors naming them and in the recipe's fingerprint."""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from zephon_torch import Pipeline
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource


def suffixed(row: dict[str, Any], suffix: str, skip: Any = ()) -> dict[str, Any]:
    return {**row, "text": row["text"] + suffix}


class Lower:
    """A callable object (its default repr holds its address)."""

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        return {**row, "text": row["text"].lower()}


_FINGERPRINT = """
import functools, json, sys
from tests.unit.test_function_names import Langs, Lower, suffixed
from zephon_torch import Pipeline
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource
source = StaticMixtureWorkSource([Dataset.from_dict("d", [{"text": "A", "ids": [1]}])])
skip = {"de", "fr", "it", "nl", "es", "pt"}  # a set's repr differs with the hash seed
pipeline = Pipeline(source).map(functools.partial(suffixed, suffix="!", skip=skip))
pipeline = pipeline.filter(Lower())
pipeline = pipeline.filter(lambda row: row["text"] not in {"de", "fr", "it", "nl", "es"})
def closing(value):
    return lambda row: row["text"] not in value
pipeline = pipeline.filter(closing(Langs(frozenset({"de", "fr", "it", "nl", "es"}))))  # repr: a set
pipeline = pipeline.filter(closing({(c, "x") for c in ("en", "fr", "de", "es", "it", "pl")}))
pipeline = pipeline.pretokenized("ids").pack_flat(8, "wrap").batch(1)
print(json.dumps(pipeline.fingerprint()["ops"]))
"""


@dataclasses.dataclass(frozen=True)
class Langs:
    names: frozenset[str]


def test_a_lambda_s_name_changes_with_any_value_it_closes_over() -> None:
    """Closed-over numpy scalars, enum members, paths, patterns and partials were named by
    their type alone: an edited threshold (`np.int64(3)` to 4) resumed onto other data."""
    import enum
    import re
    from pathlib import PurePosixPath

    from zephon_torch.errors import ConfigError
    from zephon_torch.ops.map import function_name

    class Color(enum.Enum):
        RED = 1
        BLUE = 2

    def named(value: Any) -> str:
        return function_name(lambda row: row is value, None)

    pairs = [
        (np.int64(3), np.int64(4)),
        (np.float32(0.5), np.float32(0.7)),
        (Color.RED, Color.BLUE),
        (PurePosixPath("/a"), PurePosixPath("/b")),
        (re.compile("a+"), re.compile("b+")),
        (functools.partial(max, 3), functools.partial(max, 4)),
        (lambda v: v > 3, lambda v: v > 4),
        (10**5000, 10**5000 + 1),
        ([1, 2, 3] * 1000, [1, 2, 4] * 1000),
    ]
    for one, other in pairs:
        assert named(one) != named(other), one
        assert named(one) == named(copy.deepcopy(one) if not callable(one) else one)
    itself: list[Any] = []
    itself.append(itself)
    with pytest.raises(ConfigError, match="pass `name=`"):
        named(itself)


def _longer_than(n: int) -> Callable[[dict[str, Any]], bool]:
    return lambda row: len(row["text"]) > n


def test_a_partial_or_a_callable_object_is_named_alike_in_every_process() -> None:
    """Their default names held a memory address (`repr`), which went into the state: a state
    saved in one process was refused in the next with nothing changed. A lambda's name holds a
    digest of its code and closure, the same in every process."""
    import functools
    import os
    import subprocess
    import sys

    from zephon_torch.errors import ConfigError
    from zephon_torch.ops.map import function_name

    def ops(seed: int) -> Any:
        command = [sys.executable, "-c", _FINGERPRINT]
        env = {**os.environ, "PYTHONHASHSEED": str(seed)}
        done = subprocess.run(command, capture_output=True, text=True, check=True, env=env)
        return json.loads(done.stdout)

    first = ops(1)
    assert first == ops(2)
    names = [op["name"] for op in first if op.get("kind") in ("map", "filter")]
    assert names[:2] == [
        "partial(tests.unit.test_function_names.suffixed, suffix='!', "
        "skip=set({'de', 'es', 'fr', 'it', 'nl', 'pt'}))",
        "tests.unit.test_function_names.Lower",
    ]
    assert names[2].startswith("__main__.<lambda>#")  # with a digest of its code
    assert names[3].startswith("__main__.closing.<locals>.<lambda>#")
    assert len(set(names)) == len(names) == 5

    def late() -> str:
        # a cell not filled yet (`helper` comes later) raised a bare ValueError
        named = function_name(lambda row: helper(row), None)  # noqa: PLW0108

        def helper(row: dict[str, Any]) -> bool:
            return True

        return named

    assert ".late.<locals>.<lambda>#" in late()
    # lambdas of one scope shared a name: an edited threshold resumed onto other data
    longer = [function_name(lambda row, n=n: len(row["text"]) > n, None) for n in (100, 300)]
    closing = [function_name(_longer_than(n), None) for n in (100, 300)]
    assert len({*longer, *closing}) == 4
    assert closing[0] == function_name(_longer_than(100), None)
    # arrays are named by their bytes: numpy elides long ones in the middle
    one, other = np.zeros(5000), np.zeros(5000)
    other[2500] = 1
    assert repr(one) == repr(other)
    assert function_name(functools.partial(suffixed, skip=one), None) != function_name(
        functools.partial(suffixed, skip=other), None
    )
    source = StaticMixtureWorkSource([Dataset.from_dict("d", [{"text": "A", "ids": [1]}])])
    with pytest.raises(ConfigError, match=r"memory address.*pass `name=`"):
        Pipeline(source).map(functools.partial(suffixed, suffix=object()))
    named = Pipeline(source).map(functools.partial(suffixed, suffix=object()), name="tagged")
    named = named.pretokenized("ids").pack_flat(8, "wrap").batch(1)
    assert [op["name"] for op in named.fingerprint()["ops"] if op.get("kind") == "map"] == [
        "tagged"
    ]


def test_stateful_filters_that_set_no_name_are_named_by_their_class() -> None:
    """Every filter without a `name` was "stateful_filter": a state saved with one filter
    resumed with another class and its other rule, without a word."""
    from zephon_torch.ops.stateful import StatefulFilter

    class Base(StatefulFilter):
        def keep(self, tokens: Any, source: str) -> bool:
            return True

        def state_dict(self) -> dict[str, Any]:
            return {}

        def load_state_dict(self, state: dict[str, Any]) -> None:
            pass

    class Other(Base):
        pass

    class Named(Base):
        name = "named"

    class Below(Named):
        pass

    def instance_named() -> Base:
        made = Other()
        made.name = "mine"
        return made

    source = StaticMixtureWorkSource([Dataset.from_dict("d", [{"ids": [1]}])])

    def name(factory: Any) -> str:
        pipeline = Pipeline(source).pretokenized("ids").stateful_filter(lambda lane: factory())
        (named,) = pipeline.pack_flat(8, "wrap").batch(1).fingerprint()["stateful_filters"]
        return str(named)

    where = f"{__name__}.test_stateful_filters_that_set_no_name_are_named_by_their_class"
    assert name(Base) == f"{where}.<locals>.Base"
    assert name(Other) == f"{where}.<locals>.Other"
    assert [name(Named), name(Below), name(instance_named)] == ["named", "named", "mine"]


_SPAWNED_NAME = """
import multiprocessing

from zephon_torch.ops.map import function_name


def shout(row):
    return row


def named(fn):
    return function_name(fn, None)


if __name__ == "__main__":
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        print(named(shout), pool.apply(named, (shout,)))
"""


def test_a_main_script_s_function_is_named_alike_in_a_spawned_process(tmp_path: Path) -> None:
    """A spawned process imports the main script as `__mp_main__`: its functions were named
    `__mp_main__.shout` there, `__main__.shout` in the main process, in errors and in a
    fingerprint taken there (a DataLoader walkthrough)."""
    import os
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(_SPAWNED_NAME)
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, str(script)],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["__main__.shout", "__main__.shout"]
