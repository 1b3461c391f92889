"""``zephon-torch state PATH``: what a saved state holds, readable.

A state is written packed (``_packed_rows``: a lane's per-source part and a bin packer's rows
are base64 strings), so a checkpoint no longer shows where each lane stands. This reads a
JSON file or a torch checkpoint, finds every zephon_torch state in it (a dict with
``version``, ``fingerprint`` and ``lanes``, at any depth: a Lightning checkpoint, a
``StatefulDataLoader``'s worker snapshots), and prints for each its step, the tokens and
documents delivered by source against the mixture's target, and every lane's turn, stream
positions, carried pieces and open rows; ``--json`` prints the states with their lanes as
lists instead.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any, TextIO

from zephon_torch._packed_rows import mixpack_of, unpack_lanes
from zephon_torch._state import check_shape
from zephon_torch.errors import ConfigError, StateMismatchError, shown

_KEYS = ("version", "fingerprint", "lanes")
# torch.save writes a zip archive (a pickle, before torch 1.6)
_ARCHIVE, _PICKLE = b"PK\x03\x04", b"\x80"
_SHOWN_CHARS = 80  # of a damaged part's value, in the error


def load_saved(path: str, *, trusted: bool = False) -> Any:
    """The object saved at ``path``: JSON, else a torch checkpoint (read with
    ``weights_only=True``, plain data and tensors, unless ``trusted``: a checkpoint holding
    other objects then loads whole, running what its pickles name). A checkpoint's tensors are
    mapped from the file, not read: one of tens of GB (a model's, its optimizer's) would need
    twice that in memory.

    Raises:
        ConfigError: naming the file where it is neither.
    """
    try:
        with open(path, "rb") as file:
            head = file.read(len(_ARCHIVE))
            data = b"" if head == _ARCHIVE else head + file.read()
    except OSError as error:
        raise ConfigError(f"{path}: cannot read it ({error.strerror or error})") from None
    if head == _ARCHIVE:
        return _torch_load(path, path, trusted=trusted)
    try:
        return json.loads(data)
    except UnicodeDecodeError:
        not_json = "not text"
    except json.JSONDecodeError as error:
        not_json = str(error)
    except RecursionError:  # JSON, but deeper than Python's parser goes
        raise ConfigError(f"{path}: its JSON nests too deeply to parse") from None
    if not data.startswith(_PICKLE):
        raise ConfigError(f"{path}: neither JSON ({not_json}) nor a torch checkpoint")
    return _torch_load(io.BytesIO(data), path, trusted=trusted)


def _torch_load(source: str | io.BytesIO, path: str, *, trusted: bool) -> Any:
    """`torch.load` of ``source`` (the file ``path``, mapped; or its bytes, a pickle)."""
    import pickle

    import torch

    try:
        mapped = isinstance(source, str)
        return torch.load(source, map_location="cpu", weights_only=not trusted, mmap=mapped)
    except pickle.UnpicklingError as error:
        if trusted:
            raise ConfigError(f"{path}: an unreadable torch checkpoint ({error})") from None
        refused = next((line for line in str(error).splitlines() if "GLOBAL" in line), "")
        raise ConfigError(
            f"{path}: a torch checkpoint holding objects other than plain data and tensors, "
            "which it reads only with --trusted (that runs what its pickles name: for files "
            f"you trust){': ' + refused.strip() if refused else ''}"
        ) from None
    except Exception as error:  # torch raises many kinds for a damaged file
        first = (str(error).splitlines() or [""])[0]
        raise ConfigError(
            f"{path}: an unreadable torch checkpoint ({type(error).__name__}: {first})"
        ) from None


def find_states(saved: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every zephon_torch state in ``saved``, with where it lies (``['zephon']``), outermost
    first; a state's own parts are not searched.

    Walked with a stack, each other list, tuple and dict once: a checkpoint's pickle may nest
    deeper than Python recurses (a RecursionError), or hold a list within itself, or one
    list at two places in each of 60 levels (2**60 ways down)."""
    seen: set[int] = set()
    # (value, its place): a place is (the parent's place, the key's text), joined on demand
    stack: list[tuple[Any, tuple[Any, str] | None]] = [(saved, None)]
    while stack:
        value, place = stack.pop()
        if isinstance(value, dict) and all(key in value for key in _KEYS):
            yield _where(place), value  # at each place it lies
            continue
        if not isinstance(value, dict | list | tuple) or id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, dict):
            parts = [(item, f"[{key!r}]") for key, item in value.items()]
        else:
            parts = [(item, f"[{index}]") for index, item in enumerate(value)]
        stack.extend((item, (place, text)) for item, text in reversed(parts))


def _where(place: tuple[Any, str] | None) -> str:
    texts = []
    while place is not None:
        place, text = place
        texts.append(text)
    return "".join(reversed(texts))


def report(state: dict[str, Any], out: TextIO) -> None:
    """``state`` readable: its frame, the delivered counts by source, then each lane."""
    lanes = unpack_lanes(state["lanes"])
    fingerprint = state["fingerprint"] if isinstance(state["fingerprint"], dict) else {}
    names = _names(state, lanes)
    begun = [lane for lane in lanes.values() if isinstance(lane, dict)]
    done = sum(1 for lane in begun if lane.get("done"))
    print(
        f"state version {state['version']}, step {state.get('step')}, micro-batch size "
        f"{state.get('microbatch_size', '(in the fingerprint)')}, {len(lanes)} lanes in this "
        f"state ({len(begun)} begun, {done} spent)",
        file=out,
    )
    mixing = fingerprint.get("mixing", "tokens")
    print(f"delivered by source (mixed by {mixing} shares; summed over these lanes):", file=out)
    _by_source(lanes, names, fingerprint.get("mixture"), mixing, out)
    print("lanes:", file=out)
    for lane, lane_state in sorted(lanes.items(), key=lambda kv: int(kv[0])):
        print(f"  lane {lane}: {_lane_line(lane_state, names)}", file=out)


def _names(state: dict[str, Any], lanes: dict[str, Any]) -> list[str]:
    names = state.get("datasets")
    if isinstance(names, list):
        return [str(name) for name in names]
    widest = max((len(p["delivered"]) for p in _mixpacks(lanes)), default=0)
    return [f"source {i}" for i in range(widest)]  # states saved before names were recorded


def _mixpacks(lanes: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for lane_state in lanes.values():
        mixpack = mixpack_of(lane_state)
        if mixpack is not None and isinstance(mixpack.get("delivered"), list):
            yield mixpack


def _by_source(
    lanes: dict[str, Any], names: list[str], mixture: Any, mixing: str, out: TextIO
) -> None:
    tokens, documents = [0] * len(names), [0] * len(names)
    for mixpack in _mixpacks(lanes):
        for source, (t, d) in enumerate(mixpack["delivered"][: len(names)]):
            tokens[source] += t
            documents[source] += d
    counted = tokens if mixing == "tokens" else documents
    total = sum(counted) or 1
    weights = mixture if isinstance(mixture, dict) else {}
    weight_sum = sum(w for w in weights.values() if isinstance(w, (int, float))) or 1
    width = max((len(name) for name in names), default=6)
    print(
        f"    {'source':<{width}} {'tokens':>16} {'documents':>12} {'share':>8} {'target':>8}",
        file=out,
    )
    for source, name in enumerate(names):
        weight = weights.get(name)
        target = f"{weight / weight_sum:.2%}" if isinstance(weight, (int, float)) else "-"
        print(
            f"    {name:<{width}} {tokens[source]:>16,} {documents[source]:>12,} "
            f"{counted[source] / total:>8.2%} {target:>8}",
            file=out,
        )


_SHOWN_SOURCES = 8  # the sources whose positions a lane's line names


def _lane_line(lane_state: Any, names: list[str]) -> str:
    if not isinstance(lane_state, dict):
        return "not begun"
    head = f"turn {lane_state.get('turn')}{', spent' if lane_state.get('done') else ''}"
    mixpack = mixpack_of(lane_state)
    if mixpack is None:
        return head
    if "start" in lane_state.get("pack", {}):
        head += " (counts at its shuffle block's start)"
    positions = []
    for source, saved in enumerate(mixpack.get("readers", [])):
        reader = saved
        while isinstance(reader, dict) and "reader" in reader:  # beneath stateful filters
            reader = reader["reader"]
        if isinstance(reader, dict):
            name = names[source] if source < len(names) else f"source {source}"
            positions.append(f"{name} pass {reader.get('pass')} pos {reader.get('pos')}")
    more = len(positions) - _SHOWN_SOURCES
    if more > 0:  # a mixture of hundreds of sources: a line each lane, not pages
        positions[_SHOWN_SOURCES:] = [f"and {more} more sources (--json shows them)"]
    parts = [head, "read: " + ", ".join(positions)]
    carried = sum(1 for row in mixpack.get("carry", []) if row)
    if carried:
        parts.append(f"{carried} carried piece{'s' * (carried != 1)}")
    packer = mixpack.get("packer")
    if isinstance(packer, dict) and "bins" in packer:
        rows = packer["bins"] + packer.get("ready", [])
        pieces = sum(len(row) for row in rows)
        parts.append(
            f"{len(packer['bins'])} open rows and {len(packer.get('ready', []))} closed, "
            f"{pieces} pieces"
        )
    skipped = {k: v for k, v in mixpack.get("skipped", {}).items() if v}
    if skipped:
        parts.append(f"skipped {skipped}")
    return "; ".join(parts)


def run_state(path: str, *, as_json: bool, trusted: bool, out: TextIO) -> int:
    """The ``state`` command: 0, or 2 (``failed``) where ``path`` holds no state."""
    found = list(find_states(load_saved(path, trusted=trusted)))
    if not found:
        raise ConfigError(
            f"{path}: no zephon_torch state in it (a dict with {list(_KEYS)} at any depth)"
        )
    for where, state in found:
        _check_shape(state, f"{path}{where}")
    if as_json:
        unpacked = [
            {"where": where or "(the whole file)", "state": _unpacked(state)}
            for where, state in found
        ]
        try:
            text = json.dumps(unpacked if len(unpacked) > 1 else unpacked[0]["state"], indent=1)
        except RecursionError:  # a checkpoint's pickle may nest at any depth
            raise ConfigError(
                f"{path}: a damaged zephon_torch state: a part of it nests too deeply to print"
            ) from None
        except ValueError as error:  # a part holding itself ("Circular reference detected")
            raise ConfigError(f"{path}: a damaged zephon_torch state: {error}") from None
        print(text, file=out)
        return 0
    for number, (where, state) in enumerate(found):
        text = _reported(state, f"{path}{where}")
        if len(found) > 1:
            print(f"{'' if number == 0 else chr(10)}{path}{where}:", file=out)
        out.write(text)
    return 0


def _reported(state: dict[str, Any], where: str) -> str:
    """`report` of ``state`` (found at ``where``) as text; a `ConfigError` naming ``where``
    where a part it reads is of another kind than a state holds (a count that is no number)."""
    text = io.StringIO()
    try:
        report(state, text)
    except (TypeError, ValueError, AttributeError, KeyError, IndexError) as error:
        raise ConfigError(
            f"{where}: a damaged zephon_torch state: a part of its lanes does not read "
            f"({type(error).__name__}: {error})"
        ) from None
    return text.getvalue()


def _check_shape(state: dict[str, Any], where: str) -> None:
    """Raise a `ConfigError` naming ``where`` and each part of ``state`` that a pipeline would
    refuse to load (`check_shape`): read as they were, such parts raised a traceback."""
    try:
        check_shape(state)
    except StateMismatchError as error:
        parts = "; ".join(
            f"{key} is {_cut(shown(saved))}, not {wanted}"
            for key, (saved, wanted) in error.mismatches.items()
        )
        raise ConfigError(f"{where}: a damaged zephon_torch state: {parts}") from None


def _cut(text: str) -> str:
    return text if len(text) <= _SHOWN_CHARS else f"{text[:_SHOWN_CHARS]}..."


def _unpacked(state: dict[str, Any]) -> dict[str, Any]:
    return {**state, "lanes": unpack_lanes(state["lanes"])}
