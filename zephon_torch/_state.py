"""The state contract: versioned, fingerprinted, plain JSON data, compared from one table."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from zephon_torch._regroup import KEY, as_loaded, regroup, saved_size
from zephon_torch._turn_order import padded_to
from zephon_torch.elastic import rank_turns, ranks_out_of_step
from zephon_torch.errors import ConfigError, StateMismatchError, finite_number

# 2: the mixer looks a row ahead (`choose_source`); see `version_mismatch` for version 1.
# 3: the micro-batch size beside the turns, not in the fingerprint (`_regroup`), and a bin
# packer's rows packed (`_packed_rows`); 4: a lane's per-source counts packed into one string
# (`_packed_rows.pack_sources`). States of versions 2 and 3 read as they were written.
STATE_VERSION = 4
_MODULE_ENTRY = "zephon"  # the key PipelineDataModule keeps its state under in a checkpoint


def version_note(saved: object) -> str:
    """Why a state of version ``saved`` (not this release's) is refused, as far as known."""
    if saved == 1:
        return (
            "The state was saved by a zephon_torch release whose mixer picks its sources "
            "otherwise: resumed here, it would go on with other data than the run that saved "
            "it. Resume with the release that saved it."
        )
    if type(saved) is int and saved > STATE_VERSION:
        return (
            f"The state was saved by a later zephon_torch release (state version {saved}; "
            f"this one writes {STATE_VERSION}): resume with that release."
        )
    return (
        f"No zephon_torch release writes state version {saved!r}: was the state edited, or "
        "saved by another library?"
    )


def check_state(
    state: dict[str, Any],
    fingerprint: dict[str, Any],
    needed_lanes: Iterable[int],
    *,
    live_order: list[str] | None = None,
) -> None:
    """Raise one ``StateMismatchError`` listing every difference between saved and live
    (``live_order``: the datasets' order, if not the fingerprint mixture's)."""
    check_shape(state)
    mismatches = version_mismatch(state)
    saved = state["fingerprint"]
    for key in sorted(set(saved) | set(fingerprint)):
        if saved.get(key) != fingerprint.get(key):
            mismatches[key] = (saved.get(key), fingerprint.get(key))
    if "exhaustion" in mismatches:  # one side is 'repeat', which has no passes: that line
        mismatches.pop("passes", None)  # says it all
    # lane states index the datasets by position: their order is part of the recipe. A state
    # saved before the order was recorded holds it in its mixture's keys, unless they were
    # sorted (`json.dumps(sort_keys=True)`): keys in sorted order say nothing, and are not
    # compared
    order = state.get("datasets")
    if order is None:
        keys = list(saved.get("mixture") or {})
        order = None if keys == sorted(keys) else keys
    if live_order is None:
        live_order = list(fingerprint.get("mixture") or {})
    if "mixture" not in mismatches and order is not None and list(order) != live_order:
        mismatches["order of datasets"] = (order, live_order)
    lanes = state["lanes"]
    replicas = fingerprint.get("canonical_replicas")
    if isinstance(replicas, int) and "canonical_replicas" not in mismatches:
        extra = sorted(int(lane) for lane in lanes if int(lane) >= replicas)
        if extra:
            mismatches["lane numbers"] = (
                extra,
                f"lane numbers below canonical_replicas={replicas}",
            )
    spread = _turns_apart(lanes)
    if spread:
        mismatches["lane turns"] = (
            spread,
            "lanes with data left at most one turn apart: every rank saves after the same "
            "micro-batches, and only a rank whose lanes are all spent falls behind (a lane "
            "not begun, null, is at turn 0); were the states of different steps merged by "
            "hand, a turn edited, or a lane set to null?",
        )
    missing = [lane for lane in needed_lanes if str(lane) not in lanes]
    if missing and "canonical_replicas" not in mismatches:  # no merge of ranks gives them
        mismatches["lanes"] = (
            sorted(int(k) for k in state.get("lanes", {})),
            f"needs {missing}: the state holds the lanes of some ranks only (a Pipeline's "
            "state_dict() holds its own rank's); merge every rank's state with merge_states, "
            "or save zephon_torch.torch.DataLoader's state_dict(), which gathers every rank's "
            "lanes where a torch.distributed process group is initialised",
        )
    if mismatches:
        notes = [version_note(state["version"])] if "version" in mismatches else []
        notes += [_digest_note(key, *mismatches[key]) for key in mismatches]
        raise StateMismatchError(mismatches, note="\n".join(note for note in notes if note))


def loaded_state(
    state: Any, microbatch_size: int, fingerprint: dict[str, Any], needed_lanes: Iterable[int]
) -> dict[str, Any]:
    """``state`` as a pipeline of micro-batches of ``microbatch_size`` reads it
    (``_regroup.as_loaded``), checked against the live recipe (``check_state``), every
    problem in one ``StateMismatchError``: a state of another version is refused before it is
    converted (a later release's may hold what this one cannot read), and one that cannot be
    converted is refused naming the recipe's differences beside it."""
    check_shape(state)
    saved = state["fingerprint"]
    as_saved = {**state, "fingerprint": {k: v for k, v in saved.items() if k != KEY}}
    if version_mismatch(state):
        check_state(as_saved, fingerprint, needed_lanes)  # raises, naming the version
    try:
        loaded: dict[str, Any] = as_loaded(state, microbatch_size)
    except StateMismatchError as error:
        try:
            check_state(as_saved, fingerprint, needed_lanes)
        except StateMismatchError as other:
            mismatches = {**other.mismatches, **error.mismatches}
            raise StateMismatchError(mismatches, note=other.note) from None
        raise
    check_state(loaded, fingerprint, needed_lanes)
    return loaded


def _digest_note(key: str, saved: object, live: object) -> str:
    """What a dataset's fingerprint that differs in its `rows_digest` alone means (the digest
    names no file: the mismatch showed two hex strings), or in its hub commit (`revision`)."""
    if not (key.startswith("dataset.") and isinstance(saved, dict) and isinstance(live, dict)):
        return ""
    differ = {k for k in set(saved) | set(live) if saved.get(k) != live.get(k)}
    if "revision" in differ and saved.get("revision") is not None:
        return _revision_note(key, saved["revision"], live.get("revision"))
    if differ != {"rows_digest"}:
        return ""
    return (
        f"{key}: as many shards and rows, in other files: a shard's path below the dataset's "
        "folder (a file or folder renamed, or another put in its place), or the rows per "
        "shard, changed since the state was saved"
    )


def _revision_note(key: str, saved: object, live: object) -> str:
    """How to resume on the hub commit an `hf://` dataset's state was saved at (`saved`), now
    read at `live` (None: not from the hub): the mismatch showed two hex strings, and the
    branch's name in the URL reads its latest commit."""
    now = "no hub commit" if live is None else f"commit {live} (the branch moved since)"
    return (
        f"{key}: the state was saved reading hub commit {saved}, and {now} is read now: "
        f"pin the saved one, hf://org/name@{saved}/[config/]split, to resume on its data"
    )


def _turns_apart(lanes: dict[str, Any]) -> dict[str, int] | None:
    """The turns of ``lanes`` (lane states by number) that have data left, where they stand
    more than one turn apart; None where they do not. A saved state's lanes with data are a
    turn apart at most (a step begun); a spent lane may lag (its rank's stream ended turns
    before another's). A lane not begun (None) is at turn 0: every lane gives a micro-batch
    each turn, so none is left unbegun past the first."""
    turns = {
        lane: 0 if lane_state is None else int(lane_state["turn"])
        for lane, lane_state in lanes.items()
        if lane_state is None or not lane_state["done"]
    }
    if not turns or max(turns.values()) - min(turns.values()) <= 1:
        return None
    return dict(sorted(turns.items(), key=lambda item: int(item[0])))


def version_mismatch(state: dict[str, Any]) -> dict[str, tuple[object, object]]:
    """``{"version": (saved, live)}`` unless this release continues ``state`` exactly: a state
    of its own version or of version 2 or 3, or of version 1 whose mixture holds one dataset or
    equal weights, where the look-ahead adds the same to every source and so picks as
    version 1 did."""
    saved = state["version"]
    if saved in (2, 3, STATE_VERSION) and type(saved) is int:
        return {}
    mixture = state["fingerprint"].get("mixture")
    weights = list(mixture.values()) if isinstance(mixture, dict) else []
    if saved == 1 and weights and all(w == weights[0] for w in weights):
        return {}
    return {"version": (saved, STATE_VERSION)}


_LANE_KEYS = ("turn", "done", "pack")
STATE_INT_LIMIT = 1 << 48  # counters and positions of a state: far past any run, and * L fits int64


def state_int(value: Any, where: str) -> int:
    """``value``, a count or position of a saved state: an int in ``[0, 2**48)``.

    Raises:
        StateMismatchError: naming ``where`` (``"pack.readers[1].pos"``).
    """
    if type(value) is not int or not 0 <= value < STATE_INT_LIMIT:
        raise StateMismatchError({where: (value, "an int in [0, 2**48)")})
    return value


def state_flag(value: Any, where: str) -> bool:
    """``value``, a flag of a saved state: True or False (see ``state_int``)."""
    if not isinstance(value, bool):
        raise StateMismatchError({where: (value, "true or false")})
    return value


def state_list(value: Any, length: int, where: str) -> list[Any]:
    """``value``, one entry per source of a saved state: a list of ``length`` (see
    ``state_int``)."""
    if not isinstance(value, list) or len(value) != length:
        raise StateMismatchError({where: (value, f"a list of {length} (one per dataset)")})
    return value


def state_dict_of(state: Any, keys: tuple[str, ...], where: str) -> dict[str, Any]:
    """``state``, a part of a saved state: a dict holding ``keys`` (see ``state_int``)."""
    if not isinstance(state, dict) or any(key not in state for key in keys):
        raise StateMismatchError({where: (state, f"a dict with {list(keys)}")})
    return state


def check_shape(state: Any) -> None:
    """Raise ``StateMismatchError`` unless ``state`` has the shape of a saved state: a dict
    with a version, a fingerprint dict, the datasets' names in order (absent in states saved
    before they were recorded), a token estimation (None or figures by dataset), and a
    dict of lane states, each None or a dict holding its turn, end flag and packer state (what
    that holds is checked where read: ``state_int`` and its kin)."""
    if not isinstance(state, dict) or "version" not in state:
        raise _not_a_state(state)
    problems: dict[str, tuple[object, object]] = {}
    if not isinstance(state.get("fingerprint"), dict):
        problems["fingerprint"] = (state.get("fingerprint"), "a dict of settings")
    names = state.get("datasets", [])
    if not (isinstance(names, list) and all(isinstance(name, str) for name in names)):
        problems["datasets"] = (names, "absent, or the datasets' names in order (a list of str)")
    lanes = state.get("lanes")
    if not isinstance(lanes, dict):
        problems["lanes"] = (lanes, "a dict of lane states by lane number")
    else:
        for lane, lane_state in lanes.items():
            if not _lane_key(lane):
                problems[f"lane {lane!r}"] = (lane, "a lane number as a string, e.g. '0'")
                continue
            if lane_state is None:
                continue
            try:
                state_dict_of(lane_state, _LANE_KEYS, f"lane {lane}")
                state_int(lane_state["turn"], f"lane {lane} turn")
                state_flag(lane_state["done"], f"lane {lane} done")
                state_dict_of(lane_state["pack"], (), f"lane {lane} pack")
            except StateMismatchError as error:
                problems.update(error.mismatches)
    step = state.get("step", 0)  # derived from the lanes (absent: `saved_step`)
    if type(step) is not int or step < 0:
        problems["step"] = (step, "absent, or an int (the lowest turn of the lanes)")
    elif isinstance(lanes, dict) and not problems and "step" in state:
        # a rank's lowest turn; merged, the furthest rank's: between its lanes' turns
        turns = [0 if s is None else s["turn"] for s in lanes.values()] or [0]
        if not min(turns) <= step <= max(turns):
            problems["step"] = (
                step,
                f"a turn of its lanes, {min(turns)} to {max(turns)}: lanes set to null, or "
                "turns edited, since it was saved?",
            )
    if not _figures(state.get("estimation")):
        problems["estimation"] = (
            state.get("estimation"),
            "None or, by dataset name, a dict of finite numbers",
        )
    if problems:
        raise StateMismatchError(problems)


def _lane_key(key: object) -> bool:
    """Whether ``key`` is a lane number as a state writes it ("3"). Not "00", nor a zero of
    another script (digits to ``isdigit`` and ``int``): read as lane 0, where lane "0" was
    looked up and not found, they gave a refusal saying the state lacked a lane it listed."""
    return isinstance(key, str) and key.isascii() and key.isdigit() and key == str(int(key))


_KEYS_SHOWN = 4  # top-level keys named when something else is loaded as a state


def _not_a_state(given: Any) -> StateMismatchError:
    """The error for ``given``, which is no zephon_torch state at all: what it is, and what to
    load (not "version: saved None", which reads as a state of another release)."""
    hint = ""
    if isinstance(given, dict):
        keys = [str(key) for key in given]
        more = f" (and {len(keys) - _KEYS_SHOWN} more)" if len(keys) > _KEYS_SHOWN else ""
        what = f"a dict with keys {keys[:_KEYS_SHOWN]}{more}" if keys else "an empty dict"
        if keys == [_MODULE_ENTRY]:
            # PipelineDataModule.state_dict(): easily taken for the state when restoring by hand
            hint = (
                f"; this is a PipelineDataModule checkpoint entry: load its {_MODULE_ENTRY!r} entry"
            )
    else:
        what = f"a {type(given).__name__}"
        if isinstance(given, (str, bytes)):
            hint = "; if this is a state as JSON text, load json.loads of it"
    expected = f"a zephon_torch state (a dict with 'version', 'fingerprint' and 'lanes'){hint}"
    return StateMismatchError({"state": (what, expected)})


def _figures(estimation: Any) -> bool:
    """Whether ``estimation`` is None or token figures by dataset name."""
    if estimation is None:
        return True
    return isinstance(estimation, dict) and all(
        isinstance(figures, dict)
        and all(
            isinstance(v, (int, float)) and finite_number(v) is not None for v in figures.values()
        )
        for figures in estimation.values()
    )


def state_step(lanes: dict[str, Any]) -> int:
    """A state's ``step``: the lowest turn of its lanes (0 for a lane not begun)."""
    return min(((0 if s is None else int(s["turn"])) for s in lanes.values()), default=0)


def saved_step(state: dict[str, Any]) -> int:
    """``state``'s ``step`` (checked by ``check_shape``), or where absent the one a state
    saves, its lanes' lowest turn (``state_step``), not 0."""
    return int(state["step"]) if "step" in state else state_step(state["lanes"])


def merge_states(states: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Combine the per-rank states of one step (each holding its own lanes) into a global one.
    States of replicas (processes of one data-parallel rank) may all be given: they hold the
    same lanes, which must be at the same states.

    Raises ``StateMismatchError`` when the states come from different recipes or steps, and
    ``ConfigError`` for no state at all.
    """
    states = list(states)
    if not states:
        raise ConfigError("merge_states needs at least one state (each rank's), got none")
    for state in states:
        check_shape(state)
    size = saved_size(states[0])  # one unit for the turns (see `_regroup`)
    states = [state if size is None else regroup(state, size) for state in states]
    first = states[0]
    merged = {k: v for k, v in first.items() if k != "lanes"}
    lanes: dict[str, Any] = {}
    for state in states:
        check_state(state, first["fingerprint"], [], live_order=first.get("datasets"))
    ended = [rank_turns(list(state["lanes"].values())) is None for state in states]
    going_on = [saved_step(state) for state, done in zip(states, ended) if not done]
    if going_on:  # a finished rank's lanes pad in step with the ranks going on
        states = [
            {**state, "lanes": padded_to(state["lanes"], max(going_on))} if done else state
            for state, done in zip(states, ended)
        ]
    for state in states:
        for lane, lane_state in state["lanes"].items():
            if lane in lanes and lanes[lane] != lane_state:
                raise StateMismatchError(
                    {f"lane {lane}": (lanes[lane], f"another state for it: {lane_state}")}
                )
            lanes[lane] = lane_state
    merged["lanes"] = dict(sorted(lanes.items(), key=lambda kv: int(kv[0])))
    # in step, the ranks' steps are one; ranks of a finished run under "stop" end apart, and
    # the run's step is then the last rank's
    merged["step"] = max((saved_step(s) for s in states), default=0)
    total = first["fingerprint"].get("canonical_replicas")
    # replicas of one data-parallel rank (tensor-parallel peers) hold one set of lanes
    ranks = len({tuple(sorted(state["lanes"])) for state in states})
    if ranks > 1 and isinstance(total, int) and len(lanes) == total:
        check_ranks_in_step(merged["lanes"], canonical_replicas=total, world_size=ranks)
    return merged


def check_ranks_in_step(lanes: dict[str, Any], *, canonical_replicas: int, world_size: int) -> None:
    """Refuse the lanes of ``world_size`` ranks (one state each, merged or gathered) that are
    not in step: ranks that resumed from states of different steps (mixed-up checkpoint
    files) give global batches no run gives, and their state would resume them so.

    Raises:
        StateMismatchError: naming each rank's turns.
    """
    if canonical_replicas % world_size:
        return  # not one rank's lanes per state: nothing to compare
    by_rank = ranks_out_of_step(lanes, canonical_replicas=canonical_replicas, world_size=world_size)
    if by_rank is not None:
        shown = "; ".join(
            f"rank {r}: {'spent' if turns is None else turns}" for r, turns in enumerate(by_rank)
        )
        raise StateMismatchError(
            {
                "lanes": (
                    f"the {world_size} ranks' lanes are at different turns ({shown}): states "
                    "of different steps, resumed or merged together",
                    "every rank's lanes at the turns of every other rank's (one step)",
                )
            }
        )
