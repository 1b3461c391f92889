"""`verify`'s resume checks: run with one world size too, through a DataLoader's state, and
with each simulated rank seeing its RANK and WORLD_SIZE."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from zephon_torch.verify import load_recipe, table, verify

HEADER = """
import os
from tokenizers import Tokenizer
from tests.helpers import small_pipeline, two_sources
from zephon_torch import Pipeline
from zephon_torch.ops.stateful import StatefulFilter

TOKENIZER = Tokenizer.from_file({path!r})
DATASETS = two_sources(40, 30, shard_size=8)
"""

FORGETFUL = """

class EveryThird(StatefulFilter):
    \"\"\"Drops every third document, but saves nothing: a resumed run counts from 0 again.\"\"\"

    name = "every_third"

    def __init__(self):
        self.seen = 0

    def keep(self, tokens, source):
        self.seen += 1
        return self.seen % 3 != 0

    def state_dict(self):
        return {{}}

    def load_state_dict(self, state):
        pass


def make(lane):
    return EveryThird()


def pipeline():
    recipe = small_pipeline(TOKENIZER, lanes={lanes}, exhaustion="repeat", datasets=DATASETS)
    return recipe.stateful_filter(make)
"""

RANK_MAP = """

def by_rank(row):
    return {{**row, "text": "rank" + os.environ.get("RANK", "0") + " " + row["text"]}}


def pipeline():
    source = small_pipeline(TOKENIZER, lanes=2, exhaustion="repeat", datasets=DATASETS)._source
    return (
        Pipeline(source).options(canonical_replicas=2).map(by_rank)
        .tokenize(tokenizer=TOKENIZER).pack_flat(64).batch(2)
    )
"""


def _recipe(tmp_path: Path, tokenizer: Any, body: str, **values: Any) -> Any:
    tokenizer.save(str(tmp_path / "tok.json"))
    path = tmp_path / "recipe.py"
    path.write_text((HEADER + body).format(path=str(tmp_path / "tok.json"), **values))
    return load_recipe(path)


def test_a_recipe_of_one_lane_is_resumed_and_a_state_it_loses_is_found(
    tmp_path: Path, tokenizer: Any
) -> None:
    """L=1 (the default) runs on one world size only: the fault run was left out, and a
    stateful filter that saves nothing read IDENTICAL. Now it resumes onto the same W, by
    the pipeline's state and by the DataLoader's."""
    build = _recipe(tmp_path, tokenizer, FORGETFUL, lanes=1)
    runs = verify(build, steps=8, workers=(), fault_step=3, standard=False, runners=())
    assert [r.name for r in runs] == [
        "zephon W=1",
        "zephon W=1 fault@3 -> W=1",
        "zephon W=1 loader workers=0 fault@3 -> W=1",
    ]
    assert runs[1].hashes[:3] == runs[0].hashes[:3]
    assert runs[1].hashes != runs[0].hashes and runs[2].hashes != runs[0].hashes
    assert "DIVERGES" in table(runs)


def test_a_resume_from_the_loader_s_state_with_workers_onto_more_ranks_is_identical(
    tmp_path: Path, tokenizer: Any
) -> None:
    build = _recipe(tmp_path, tokenizer, FORGETFUL.replace("self.seen % 3 != 0", "True"), lanes=4)
    runs = verify(
        build, steps=6, world_sizes=[1, 4], workers=(2,), fault_step=2, standard=False, runners=()
    )
    assert runs[-1].name == "zephon W=1 loader workers=2 fault@2 -> W=4"
    assert all(r.hashes == runs[0].hashes and r.error is None for r in runs), table(runs)


def test_a_map_that_reads_its_rank_diverges_across_world_sizes(
    tmp_path: Path, tokenizer: Any
) -> None:
    """Ranks are simulated in one process: each now sees the RANK and WORLD_SIZE a real job's
    would, so a map that reads its rank changes the data on W=2 as it would there."""
    build = _recipe(tmp_path, tokenizer, RANK_MAP)
    runs = verify(build, steps=4, world_sizes=[1, 2], workers=(), standard=False, runners=())
    assert runs[0].name == "zephon W=1" and runs[1].name == "zephon W=2"
    assert runs[1].hashes[0] != runs[0].hashes[0]
