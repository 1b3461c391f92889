"""Every warning is a ``ZephonWarning`` given from the user's line: the one that iterates, also
where the library warns on its prefetch thread or a tokenizing thread."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

import zephon_torch
from tests.conftest import prose_documents
from zephon_torch import Pipeline, ZephonWarning
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource


def _pipeline(
    folder: Path, tokenizer: Any, prefetch: int, runner: str, *, shuffle: int = 0
) -> Pipeline:
    lines = [json.dumps({"text": t}) for t in prose_documents(40, seed=5)]
    lines[7] = '{"body": "no text"}'  # skipped, with a warning
    folder.mkdir()
    (folder / "part-0.jsonl").write_text("\n".join(lines) + "\n")
    source = StaticMixtureWorkSource([Dataset.from_path("d", folder)], seed=1, exhaustion="stop")
    pipeline = (
        Pipeline(source)
        .options(bad_rows="skip", prefetch=prefetch)
        .tokenize(tokenizer=tokenizer, runner=runner)  # type: ignore[arg-type]
        .pack_flat(64, "wrap")
    )
    return (pipeline.shuffle(shuffle) if shuffle else pipeline).batch(2)


@pytest.mark.parametrize(("prefetch", "runner"), [(0, "inline"), (2, "inline"), (2, "threads")])
def test_a_warning_in_iteration_points_at_the_loop(
    tmp_path: Path, tokenizer: Any, prefetch: int, runner: str
) -> None:
    pipeline = _pipeline(tmp_path / "d", tokenizer, prefetch, runner)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = _line() + 1
        batches = list(pipeline)
    assert batches
    said = [w for w in caught if "skipping rows that raise an error" in str(w.message)]
    assert len(said) == 1
    assert said[0].category is ZephonWarning and issubclass(ZephonWarning, UserWarning)
    assert (said[0].filename, said[0].lineno) == (__file__, line)


@pytest.mark.parametrize("through", ["shuffle", "DataLoader"])
def test_a_warning_through_torchdata_or_torch_s_loader_points_at_the_loop(
    tmp_path: Path, tokenizer: Any, through: str
) -> None:
    """torchdata's nodes (a shuffle buffer) and torch's DataLoader fetch (no workers) stand
    between the user's loop and the library: walked through as the library's (a review found
    the warnings at torchdata's base_node.py and at pack.py)."""
    from zephon_torch.torch import DataLoader

    pipeline = _pipeline(tmp_path / "d", tokenizer, 0, "inline", shuffle=4)
    loop: Any = pipeline if through == "shuffle" else DataLoader(pipeline, num_workers=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = _line() + 1
        assert list(loop)
    said = [w for w in caught if "skipping rows that raise an error" in str(w.message)]
    assert [(w.filename, w.lineno) for w in said] == [(__file__, line)]


def test_zephon_warnings_alone_can_be_made_errors(tmp_path: Path, tokenizer: Any) -> None:
    pipeline = _pipeline(tmp_path / "d", tokenizer, 2, "threads")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        warnings.filterwarnings("error", category=ZephonWarning)
        with pytest.raises(ZephonWarning, match="skipping rows"):
            list(pipeline)
    assert "ZephonWarning" in zephon_torch.__all__


_FROM_A_STRING = """
import sys
from tokenizers import Tokenizer
from zephon_torch import Pipeline
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource

source = StaticMixtureWorkSource([Dataset.from_path("d", sys.argv[1])], exhaustion="stop")
tokenizer = Tokenizer.from_file(sys.argv[2])
pipeline = Pipeline(source).options(bad_rows="skip", prefetch=2).tokenize(tokenizer=tokenizer)
print(sum(1 for _ in pipeline.pack_flat(64, "wrap").batch(2)))
"""


@pytest.mark.parametrize("how", ["-c", "stdin"])
def test_a_warning_from_the_prefetch_thread_of_a_script_given_as_a_string_is_given(
    tmp_path: Path, tokenizer: Any, how: str
) -> None:
    """The warning's site was handed to `warn_explicit` with its module's globals, whose
    loader `python -c` and `python -` cannot give source: the warning raised ImportError
    ('__main__' is not a built-in module) and ended the run, even with warnings ignored."""
    folder = tmp_path / "d"
    folder.mkdir()
    lines = [json.dumps({"text": t}) for t in prose_documents(20, seed=5)]
    lines[3] = '{"body": "no text"}'  # skipped, with a warning from the prefetch thread
    (folder / "part-0.jsonl").write_text("\n".join(lines) + "\n")
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    arguments = [str(folder), str(tmp_path / "tokenizer.json")]
    root = str(Path(zephon_torch.__file__).parent.parent)
    command = [sys.executable, "-c", _FROM_A_STRING] if how == "-c" else [sys.executable, "-"]
    done = subprocess.run(
        [*command, *arguments],
        check=False,
        input=None if how == "-c" else _FROM_A_STRING,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": root, "PATH": "", "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 0
    assert "ZephonWarning: bad_rows='skip': skipping rows" in done.stderr


def _line() -> int:
    """The caller's line number."""
    import sys

    return sys._getframe(1).f_lineno
