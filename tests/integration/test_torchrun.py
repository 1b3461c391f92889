"""Real torchrun jobs (gloo, CPU): checkpoint on 4 ranks, resume on 2 and on 1, same batches."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import as_lists, run_torchrun


def torchrun(
    nproc: int, out: Path, tokenizer_path: Path, *extra: str, fails: bool = False
) -> dict[str, str]:
    """The job's global batch digests by step; with `fails`, its stderr under "stderr"."""
    out.mkdir(parents=True, exist_ok=True)
    args = ("--tokenizer", str(tokenizer_path), "--out", str(out), *extra)
    done = run_torchrun("torchrun_job.py", nproc, *args)
    if fails:
        assert done.returncode != 0
        return {"stderr": done.stderr}
    assert done.returncode == 0, done.stderr[-3000:]
    steps: dict[str, str] = json.loads((out / "steps.json").read_text())
    return steps


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any) -> Path:
    path = tmp_path_factory.mktemp("torchrun") / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def test_a_four_rank_checkpoint_resumes_on_two_and_one_rank_with_identical_global_batches(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    steps, cut = 12, 5
    four = torchrun(
        4, tmp_path / "w4", tokenizer_path, "--steps", str(steps), "--save-at", str(cut)
    )
    one_fresh = torchrun(1, tmp_path / "w1", tokenizer_path, "--steps", str(steps))
    assert four == one_fresh
    assert len(four) == steps
    state = tmp_path / "w4" / "state.json"
    assert json.loads(state.read_text())["step"] == cut
    again = 9  # the 2-rank job saves too: a resumed job's state resumes as well
    two = torchrun(
        2, tmp_path / "r2", tokenizer_path, "--steps", str(steps), "--load", str(state),
        "--save-at", str(again),
    )  # fmt: skip
    one = torchrun(1, tmp_path / "r1", tokenizer_path, "--steps", str(steps), "--load", str(state))
    expected = {k: v for k, v in four.items() if int(k) >= cut}
    assert two == expected
    assert one == expected
    # each rank reported its loaded state's lanes of the other ranks too: gathered, the last
    # rank's stale copies overwrote the others' (step 5 named, lanes at turns 5 and 9)
    second = json.loads((tmp_path / "r2" / "state.json").read_text())
    assert second["step"] == again
    assert {lane["turn"] for lane in second["lanes"].values()} == {again}
    chained = torchrun(
        1, tmp_path / "c1", tokenizer_path, "--steps", str(steps), "--load",
        str(tmp_path / "r2" / "state.json"),
    )  # fmt: skip
    assert chained == {k: v for k, v in four.items() if int(k) >= again}


def test_a_state_saved_mid_step_is_refused_on_two_ranks(
    tmp_path: Path, tokenizer: Any, tokenizer_path: Path
) -> None:
    """Each rank checked only its own lanes, which agreed: the ranks then ran a turn apart."""
    from tests.helpers import small_pipeline, two_sources
    from zephon_torch.torch import DataLoader

    pipeline = small_pipeline(
        tokenizer, lanes=4, exhaustion="repeat", datasets=two_sources(40, 30, shard_size=8)
    )
    loader = DataLoader(pipeline)
    batches = iter(loader)
    for _ in range(6):  # a step and a half: lanes 0, 1 at turn 2, lanes 2, 3 at turn 1
        next(batches)
    state = tmp_path / "mid.json"
    state.write_text(json.dumps(loader.state_dict()))
    failed = torchrun(
        2, tmp_path / "r2", tokenizer_path, "--steps", "4", "--load", str(state), fails=True
    )
    assert "saved mid-step: lanes at turns [1, 2]" in failed["stderr"]


def test_ranks_that_loaded_states_of_different_steps_are_named_when_the_state_is_gathered(
    tmp_path: Path, tokenizer: Any, tokenizer_path: Path
) -> None:
    """Each load was of a whole state and passed; the gathered state then held rank 0's lanes
    two turns ahead of rank 1's, and resumed so: global batches no run gives."""
    from tests.helpers import small_pipeline, two_sources
    from zephon_torch.torch import DataLoader

    pipeline = small_pipeline(
        tokenizer, lanes=4, exhaustion="repeat", datasets=two_sources(40, 30, shard_size=8)
    )
    loader = DataLoader(pipeline)
    batches = iter(loader)
    for at in (2, 4):
        for _ in range(4 * 2):  # two steps of the one rank's four lanes
            next(batches)
        (tmp_path / f"at{at}.json").write_text(json.dumps(loader.state_dict()))
    failed = torchrun(
        2, tmp_path / "r2", tokenizer_path, "--steps", "6", "--save-at", "5",
        "--load", str(tmp_path / "at4.json"), "--last-rank-load", str(tmp_path / "at2.json"),
        fails=True,
    )  # fmt: skip
    assert (
        "the 2 ranks' lanes are at different turns (rank 0: [5, 5]; rank 1: [3, 3])"
        in (failed["stderr"])
    )
    assert not (tmp_path / "r2" / "state.json").exists()


@pytest.mark.parametrize(
    ("flag", "value", "named"),
    [
        ("--last-rank-algorithm", "best_fit", "'best_fit'"),
        ("--last-rank-microbatch", "4", "microbatch_size: 2 on rank 0, 4 on rank 1"),
    ],
)
def test_ranks_running_different_recipes_are_named_at_the_first_iteration(
    tmp_path: Path, tokenizer_path: Path, flag: str, value: str, named: str
) -> None:
    """Each rank stamped the gathered lanes with its own fingerprint: a state of two recipes
    was saved without a word, and its resume failed as if the data had changed. Then the
    ranks were named when the state was gathered, after training on mixed data until the
    first checkpoint (a fresh-user trial); now at the loader's first iteration, step 0. The
    micro-batch size, outside the fingerprint, is compared too: the ranks' turns count it."""
    failed = torchrun(
        2, tmp_path / "r2", tokenizer_path, "--steps", "4", "--save-at", "2",
        flag, value, fails=True,
    )  # fmt: skip
    assert "the ranks run different recipes" in failed["stderr"]
    assert "on rank 0" in failed["stderr"] and named in failed["stderr"]
    assert "in check_data_parallel" in failed["stderr"]  # at iter(), before any batch
    assert "in all_gather_lane_states" not in failed["stderr"]
    assert not (tmp_path / "r2" / "state.json").exists()


@pytest.mark.parametrize(("exhaustion", "workers"), [("repeat", "0"), ("stop", "2")])
def test_ranks_iterating_again_mid_step_go_on_as_one_process(
    tmp_path: Path, tokenizer_path: Path, exhaustion: str, workers: str
) -> None:
    """A loader iterated anew after 7 micro-batches (an epoch limit that is no whole number of
    steps of 2 micro-batches per rank) refused to go on: its lanes were a turn apart, which
    on every rank alike is where the ranks stopped in step."""
    steps = "0" if exhaustion == "stop" else "10"
    common = ("--steps", steps, "--exhaustion", exhaustion, "--rows", "8,6")
    one = torchrun(1, tmp_path / "one", tokenizer_path, *common)
    again = ("--again-every", "7", "--workers", workers)
    assert torchrun(2, tmp_path / "again", tokenizer_path, *common, *again) == one


def test_ranks_with_dataloader_workers_give_the_same_global_batches(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    plain = torchrun(2, tmp_path / "plain", tokenizer_path, "--steps", "6")
    workers = torchrun(2, tmp_path / "workers", tokenizer_path, "--steps", "6", "--workers", "2")
    assert plain == workers


def test_a_rank_dealt_no_document_pads_on_under_repeat_as_in_one_process(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    """Datasets of 3 and 2 documents over 8 lanes: rank 1 (lanes 4 to 7) is dealt none. Its
    loader ended at once while rank 0's went on, and the job hung in rank 0's next gather."""
    common = ("--steps", "4", "--lanes", "8", "--rows", "3,2")
    one = torchrun(1, tmp_path / "one", tokenizer_path, *common)
    assert len(one) == 4
    assert torchrun(2, tmp_path / "two", tokenizer_path, *common, "--workers", "2") == one


def test_with_a_finite_dataset_every_rank_ends_on_the_same_step(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    one = torchrun(1, tmp_path / "one", tokenizer_path, "--steps", "0", "--exhaustion", "stop")
    four = torchrun(4, tmp_path / "four", tokenizer_path, "--steps", "0", "--exhaustion", "stop")
    assert len(one) > 5
    assert four == one  # same steps, same global batches, padding where a lane ran out


def test_the_final_state_of_a_finite_stream_on_several_ranks_is_one_process_s(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    """Every lane spent, as one process's final state has it. The ranks' stream ended at the
    turn no rank had data in, whose lanes' states were not recorded: a lane whose last batch
    was full (micro-batches of one row) kept that batch's state, read as not done."""
    common = ("--steps", "0", "--exhaustion", "stop", "--microbatch", "1", "--save-final")
    one = torchrun(1, tmp_path / "one", tokenizer_path, *common)
    assert torchrun(2, tmp_path / "two", tokenizer_path, *common) == one
    final_one, final_two = (
        json.loads((tmp_path / name / "final.json").read_text()) for name in ("one", "two")
    )
    assert final_two == final_one
    lanes = as_lists(final_two)["lanes"]
    assert all(lane["done"] for lane in lanes.values())
    assert final_two["step"] == len(one)


@pytest.mark.parametrize("then", ["pipeline", "own-state"])
def test_a_loader_starting_from_its_ranks_own_lanes_goes_on_as_one_process(
    tmp_path: Path, tokenizer_path: Path, then: str
) -> None:
    """A pipeline that gave a step before the loader took it, or a rank's own pipeline state
    loaded into a loader, was refused at iter() as 'saved mid-step': the other ranks' lanes,
    absent from that state, counted as turn 0."""
    one = torchrun(1, tmp_path / "one", tokenizer_path, "--steps", "4")
    peek = ("--peek-steps", "1", "--peek-then", then)
    assert torchrun(2, tmp_path / "two", tokenizer_path, "--steps", "4", *peek) == one


def test_a_sigterm_to_the_job_stops_ranks_with_workers_at_one_step_and_their_state_resumes(
    tmp_path: Path, tokenizer_path: Path
) -> None:
    """torchrun passes a SIGTERM (Slurm's, before its SIGKILL) on to each rank's process
    group, DataLoader workers included, which died of it: the ranks' handlers went on to their
    checkpoint, and gathering the state failed ("DataLoader worker (pid ...) is killed by
    signal: Terminated"). The job ends with every process of it (its output pipes close)."""
    out = tmp_path / "cut"
    out.mkdir()
    args = ("--tokenizer", str(tokenizer_path), "--out", str(out), "--steps", "0")
    until = ("--workers", "2", "--until-sigterm")
    done = run_torchrun("torchrun_job.py", 2, *args, *until, sigterm_at=out / "ready")
    assert "SignalException" in done.stderr  # torchrun's own ending, whatever the ranks do
    stop = json.loads((out / "state.json").read_text())["step"]
    cut = json.loads((out / "steps.json").read_text())
    assert stop > 10 and len(cut) == stop, done.stderr[-3000:]
    fresh = torchrun(1, tmp_path / "fresh", tokenizer_path, "--steps", str(stop + 4))
    assert cut == {k: v for k, v in fresh.items() if int(k) < stop}
    load = ("--load", str(out / "state.json"))
    resumed = torchrun(1, tmp_path / "resumed", tokenizer_path, "--steps", str(stop + 4), *load)
    assert resumed == {k: v for k, v in fresh.items() if int(k) >= stop}
