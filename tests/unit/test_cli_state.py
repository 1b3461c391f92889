"""`zephon-torch state`: a saved state, packed as it is written, printed readable."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from zephon_torch import Pipeline
from zephon_torch._packed_rows import unpack_lanes
from zephon_torch.cli import main
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource, TokenEstimation


def _state(algorithm: str = "best_fit", shuffle: int | None = None) -> dict[str, Any]:
    data = [
        Dataset.from_dict(name, {"ids": [[base + i] * (3 + i % 7) for i in range(300)]})
        for name, base in (("code", 1), ("prose", 1000))
    ]
    source = StaticMixtureWorkSource(
        data,
        {"code": 0.7, "prose": 0.3},
        seed=1,
        exhaustion="repeat",
        token_estimation=TokenEstimation(calibration_documents=4),
    )
    recipe = Pipeline(source).options(canonical_replicas=4).pretokenized("ids")
    bins = {} if algorithm == "wrap" else {"num_bins": 3}
    recipe = recipe.pack_flat(16, algorithm, **bins)  # type: ignore[arg-type]
    if shuffle:
        recipe = recipe.shuffle(shuffle)
    pipeline = recipe.batch(2)
    batches = iter(pipeline)
    for _ in range(4 * 5):
        next(batches)
    return json.loads(json.dumps(pipeline.state_dict()))


def test_a_state_prints_its_delivered_counts_by_source_and_each_lane(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = _state()
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))
    assert main(["state", str(path)]) == 0
    out = capsys.readouterr().out
    lanes = unpack_lanes(state["lanes"])
    assert out.startswith("state version 4, step 5, micro-batch size 2, 4 lanes in this state")
    assert "mixed by tokens shares" in out
    for source, name in enumerate(("code", "prose")):
        tokens = sum(lane["pack"]["delivered"][source][0] for lane in lanes.values())
        documents = sum(lane["pack"]["delivered"][source][1] for lane in lanes.values())
        line = re.search(rf"^    {name} +([\d,]+) +([\d,]+) +([\d.]+)% +([\d.]+)%$", out, re.M)
        assert line is not None, out
        assert (int(line[1].replace(",", "")), int(line[2].replace(",", ""))) == (
            tokens,
            documents,
        )
        assert float(line[4]) == (70.0, 30.0)[source]
        assert abs(float(line[3]) - (70.0, 30.0)[source]) < 10  # within a few documents
    for lane, lane_state in lanes.items():
        packer = lane_state["pack"]["packer"]
        readers = lane_state["pack"]["readers"]
        pieces = sum(len(row) for row in packer["bins"] + packer["ready"])
        assert (
            f"  lane {lane}: turn {lane_state['turn']}; read: code pass 0 pos "
            f"{readers[0]['pos']}, prose pass 0 pos {readers[1]['pos']}; "
            f"{len(packer['bins'])} open rows and {len(packer['ready'])} closed, {pieces} pieces"
        ) in out


def test_every_state_of_a_torch_checkpoint_is_printed_with_where_it_lies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wrap, shuffled = _state("wrap"), _state(shuffle=2)
    path = tmp_path / "last.ckpt"
    torch.save({"epoch": 3, "loops": {"zephon": wrap}, "workers": [shuffled]}, path)
    assert main(["state", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{path}['loops']['zephon']:\nstate version 4" in out
    assert f"{path}['workers'][0]:\nstate version 4" in out
    assert "(counts at its shuffle block's start)" in out  # the shuffled one's lanes
    assert main(["state", str(path), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [found["where"] for found in printed] == ["['loops']['zephon']", "['workers'][0]"]
    assert printed[0]["state"] == {**wrap, "lanes": unpack_lanes(wrap["lanes"])}
    assert printed[1]["state"]["lanes"] == unpack_lanes(shuffled["lanes"])
    # a checkpoint holding an object beyond plain data loads only when trusted
    torch.save({"zephon": wrap, "hparams": _Settings()}, path)
    assert main(["state", str(path)]) == 2
    said = capsys.readouterr().err
    assert "holding objects other than plain data and tensors" in said
    assert "only with --trusted" in said and "_Settings" in said  # the object refused
    assert main(["state", str(path), "--trusted"]) == 0
    assert capsys.readouterr().out.startswith("state version 4, step 5")


class _Settings:
    """An object a checkpoint may hold (hyperparameters), which weights_only refuses."""


def test_a_lone_state_as_json_is_its_lanes_as_lists(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = _state()
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"zephon": state}))
    assert main(["state", str(path), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == {**state, "lanes": unpack_lanes(state["lanes"])}
    assert isinstance(printed["lanes"]["0"]["pack"]["readers"], list)


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b'{"step": 3}', "no zephon_torch state in it"),
        (b"\x00\x01 not a checkpoint", "neither JSON (not text) nor a torch"),
        (b'{"text": "a"}\n{"text": "b"}\n', "neither JSON (Extra data: line 2"),  # JSONL
        (b"PK\x03\x04 cut short", "an unreadable torch checkpoint"),
        (b"[1, 2", "neither JSON (Expecting ',' delimiter: line 1"),
        (None, "cannot read it"),
    ],
)
def test_a_file_without_a_state_is_an_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None, said: str
) -> None:
    path = tmp_path / "saved"
    if content is not None:
        path.write_bytes(content)
    assert main(["state", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"zephon-torch state: error: {path}: {said}"), err


def test_a_damaged_packing_is_an_error_naming_the_lane_and_part(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = _state()
    state["lanes"]["2"]["pack"]["sources"] = state["lanes"]["2"]["pack"]["sources"][:-6]
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))
    assert main(["state", str(path)]) == 2
    assert "lane 2 pack.sources" in capsys.readouterr().err


def _lanes_garbage(state: dict[str, Any]) -> None:
    state["lanes"] = "garbage"


def _lane_named_x(state: dict[str, Any]) -> None:
    state["lanes"]["x"] = state["lanes"].pop("3")


def _skipped_null(state: dict[str, Any]) -> None:
    state["lanes"]["1"]["pack"]["skipped"] = None


def _delivered_short(state: dict[str, Any]) -> None:
    state["lanes"] = unpack_lanes(state["lanes"])  # a state of lists loads as well
    state["lanes"]["2"]["pack"]["delivered"][0] = [5]


_FRAME = "lanes is 'garbage', not a dict of lane states by lane number"
_LANE_KEY = "lane 'x' is 'x', not a lane number as a string, e.g. '0'"


@pytest.mark.parametrize(
    ("damage", "said", "options"),
    [
        (_lanes_garbage, _FRAME, []),
        (_lanes_garbage, _FRAME, ["--json"]),
        (_lane_named_x, _LANE_KEY, []),
        (_lane_named_x, _LANE_KEY, ["--json"]),
        # read by the report alone: --json prints them as they are
        (_skipped_null, "does not read (AttributeError: 'NoneType' object has no attr", []),
        (_delivered_short, "does not read (ValueError: not enough values to unpack", []),
    ],
)
def test_a_state_damaged_in_its_frame_or_lanes_is_one_error_line_naming_it(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    damage: Any,
    said: str,
    options: list[str],
) -> None:
    """Such a state (edited by hand, or another library's dict with the same keys) printed
    a traceback with exit code 1 (a lane not a dict: "not begun", with 0)."""
    state = _state()
    damage(state)
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))
    assert main(["state", str(path), *options]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"zephon-torch state: error: {path}: a damaged zephon_torch")
    assert said in captured.err and captured.err.count("\n") == 1
    assert not captured.out  # nothing of it printed before the error


_PEAK_GROWTH = """
import resource, sys
import torch
from zephon_torch.cli import main
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
assert main(["state", sys.argv[1]]) == 0
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
"""


def test_a_large_checkpoint_is_read_without_loading_its_tensors_into_memory(
    tmp_path: Path,
) -> None:
    """The file was read whole, then its tensors loaded from those bytes: a 256 MB checkpoint
    took 240 to 500 MB more at its peak (the command's own reading takes about 45 MB), so a
    model's of tens of GB ran out of memory."""
    path = tmp_path / "last.ckpt"
    torch.save({"model": {"w": torch.zeros(64 << 20)}, "zephon": _state()}, path)
    done = subprocess.run(
        [sys.executable, "-c", _PEAK_GROWTH, str(path)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert done.stdout.startswith("state version 4")
    assert int(done.stdout.split()[-1]) < 128  # MB more at its peak


_DEEP = 100_000  # levels of lists: past Python's recursion, not past pickle's (it loops)


def _text(value: str) -> bytes:
    """A str in pickle's opcodes (BINUNICODE)."""
    data = value.encode()
    return b"X" + len(data).to_bytes(4, "little") + data


def _deep_list() -> bytes:
    """A list nested `_DEEP` lists deep, in pickle's opcodes (EMPTY_LIST, then APPENDs): what
    no pickler writes (it recurses), but a checkpoint's bytes may hold."""
    return b"]" * _DEEP + b"a" * (_DEEP - 1)


def _checkpoint(path: Path, pickled: bytes) -> Path:
    """A torch checkpoint (weights_only reads it) whose object is the pickle ``pickled``."""
    torch.save({}, path)
    with zipfile.ZipFile(path) as saved:
        parts = [(info.filename, saved.read(info.filename)) for info in saved.infolist()]
    with zipfile.ZipFile(path, "w") as rewritten:
        for name, data in parts:
            rewritten.writestr(
                name, b"\x80\x02" + pickled + b"." if name.endswith("data.pkl") else data
            )
    return path


def _state_with(key: str, value: bytes) -> bytes:
    """A state dict whose `key` is the pickled ``value``, the rest of its frame empty."""
    parts = {"version": b"K\x04", "fingerprint": b"}", "lanes": b"}", key: value}
    return b"}(" + b"".join(_text(name) + part for name, part in parts.items()) + b"u"


@pytest.mark.parametrize(
    ("saved", "said"),
    [
        ("deep.json", "its JSON nests too deeply to parse"),
        (_deep_list(), "no zephon_torch state in it"),
        (b"]q\x00h\x00a", "no zephon_torch state in it"),  # a list holding itself
        (
            _state_with("lanes", _deep_list()),
            "a damaged zephon_torch state: lanes is a list nested",
        ),
    ],
    ids=["json", "checkpoint", "circular", "state"],
)
def test_a_file_nesting_past_python_s_recursion_is_an_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], saved: str | bytes, said: str
) -> None:
    """Each was a bare RecursionError traceback: JSON's parser, the search for states (a
    checkpoint's unpickler builds any depth, and a list holding itself), the error's repr."""
    if isinstance(saved, str):
        path = tmp_path / saved
        path.write_text("[" * _DEEP + "]" * _DEEP)
    else:
        path = _checkpoint(tmp_path / "last.ckpt", saved)
    for json_flag in ([], ["--json"]):
        assert main(["state", str(path), *json_flag]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"zephon-torch state: error: {path}: {said}"), err


def test_a_state_holding_parts_too_deep_to_print_is_named_under_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lane = {"turn": b"K\x00", "done": b"\x89", "pack": b"}(" + _text("x") + _deep_list() + b"u"}
    lanes = b"}(" + _text("0") + b"}(" + b"".join(_text(k) + v for k, v in lane.items()) + b"uu"
    path = _checkpoint(tmp_path / "last.ckpt", _state_with("lanes", lanes))
    assert main(["state", str(path)]) == 0
    assert "lane 0: turn 0" in capsys.readouterr().out
    assert main(["state", str(path), "--json"]) == 2
    said = f"{path}: a damaged zephon_torch state: a part of it nests too deeply to print"
    assert said in capsys.readouterr().err


def test_a_state_of_many_sources_names_eight_a_lane(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each lane's line named every source's position: 385 KB for 300 sources on 64 lanes."""
    data = [Dataset.from_dict(f"s{n}", {"ids": [[n + 1] * 5] * 20}) for n in range(12)]
    source = StaticMixtureWorkSource(data, seed=1, exhaustion="repeat")
    pipeline = Pipeline(source).options(canonical_replicas=2).pretokenized("ids")
    pipeline = pipeline.pack_flat(16).batch(1)
    batches = iter(pipeline)
    for _ in range(6):
        next(batches)
    path = tmp_path / "state.json"
    path.write_text(json.dumps(pipeline.state_dict()))
    assert main(["state", str(path)]) == 0
    out = capsys.readouterr().out
    lanes = [line for line in out.splitlines() if line.startswith("  lane ")]
    assert len(lanes) == 2
    for line in lanes:
        assert " s7 pass " in line and " s8 pass " not in line
        assert "and 4 more sources (--json shows them)" in line
    assert all(f"    s{n} " in out for n in range(12))  # the counts by source: every one
