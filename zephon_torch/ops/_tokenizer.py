"""Resolve what the user passed as a tokenizer into the fast ``tokenizers`` backend.

The hot path calls the Rust backend's ``encode_batch_fast`` directly (no offsets, no Python
post-processing), so whatever the user hands over is reduced to a ``tokenizers.Tokenizer`` plus
its BOS/EOS ids and a content digest for the state fingerprint.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from zephon_torch._origin import IMPORTED_IN
from zephon_torch.errors import ConfigError
from zephon_torch.io._cache import LruCache

_EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eot_id|>", "[SEP]")
_BOS_CANDIDATES = ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "[CLS]")
_PROBES = 8  # vocabulary entries tried where "a" does not encode (see `_added_ids`)
# where a saved folder or hub repository names its BOS and EOS
_NAMING_FILES = ("tokenizer_config.json", "special_tokens_map.json")
_PARALLELISM = "TOKENIZERS_PARALLELISM"
_PARALLELISM_OFF = ("", "off", "false", "f", "no", "n", "0")  # as the backend reads the variable


def fork_safe_backend() -> None:
    """In a forked process, keep the backend off the thread pool it inherited.

    The backend's pool of threads is created on first use; a fork copies it without its threads,
    so an ``encode_batch`` in the child waits forever if the parent had used the pool (a
    DataLoader worker under Linux's default start method, after the parent tokenized anything).
    The backend turns its pool off in such a child itself, unless ``TOKENIZERS_PARALLELISM``
    asks for it: then this turns it off. The pipeline's own threads still tokenize in parallel.
    """
    value = os.environ.get(_PARALLELISM)
    if os.getpid() != IMPORTED_IN and value is not None and value.lower() not in _PARALLELISM_OFF:
        os.environ[_PARALLELISM] = "false"


@dataclass(frozen=True)
class ResolvedTokenizer:
    """The backend and what the pipeline needs to know about it."""

    backend: Tokenizer
    bos_id: int | None
    eos_id: int | None
    digest: str
    description: str
    split_special_tokens: bool = False  # text spelling a special token stays text
    adds_bos: bool = False  # its own post-processing starts every sequence with BOS
    before: tuple[int, ...] = ()  # the ids its own post-processing puts before every text

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Unpickled (the processes runner): a pickled ``Tokenizer`` forgets the setting."""
        self.__dict__.update(state)
        self.backend.encode_special_tokens = self.split_special_tokens


def resolve_tokenizer(
    tokenizer_id: str | os.PathLike[str] | None,
    tokenizer: Any,
    *,
    bos_token: str | None,
    eos_token: str | None,
) -> ResolvedTokenizer:
    """Turn a hub id, a local directory or file, or a tokenizer object into a backend."""
    if (tokenizer_id is None) == (tokenizer is None):
        raise ConfigError("`tokenize` needs exactly one of `tokenizer_id` or `tokenizer`")
    bos_name, eos_name = bos_token, eos_token
    if tokenizer is None:
        tokenizer, description = _load(str(tokenizer_id))
    else:
        description = type(tokenizer).__name__
    if isinstance(tokenizer, Tokenizer):
        backend = tokenizer
        # tokenizer.json does not hold it: text that spells a special token ("<|endoftext|>"
        # in a web page) stays text when the user set it so on the object
        split_special = bool(backend.encode_special_tokens)
    elif isinstance(getattr(tokenizer, "backend_tokenizer", None), Tokenizer):
        backend = tokenizer.backend_tokenizer
        bos_name = bos_name or getattr(tokenizer, "bos_token", None)
        eos_name = eos_name or getattr(tokenizer, "eos_token", None)
        # transformers' own setting: its backend's flag is what the last call asked for (a
        # call with `split_special_tokens=` leaves it set until the next one)
        split_special = bool(
            getattr(tokenizer, "split_special_tokens", backend.encode_special_tokens)
        )
    else:
        raise ConfigError(
            "`tokenizer` must be a tokenizers.Tokenizer or a transformers fast tokenizer, "
            f"got {type(tokenizer).__name__}"
        )
    try:
        text = backend.to_str()
    except Exception as error:  # a component written in Python ("Custom PreTokenizer ...")
        raise ConfigError(
            f"the tokenizer ({description}) cannot be serialized: {error}. Its JSON is what "
            "the pipeline copies, fingerprints and sends to workers, so components written in "
            "Python are not supported: use the library's built-in ones, or change the text "
            "with a `map` before `tokenize`"
        ) from error
    config = json.loads(text)  # read once: a large vocabulary's JSON takes 0.1-0.3 s to parse
    dropout = config.get("model", {}).get("dropout")
    if dropout:  # random merges: the same document would give other ids on every read
        raise ConfigError(
            f"the tokenizer's BPE dropout is {dropout}: it tokenizes at random, so neither "
            "the batches nor a resume (which re-reads open rows) could be reproduced; set "
            "`tokenizer.model.dropout = None` (or 0)"
        )
    backend, (prefix, suffix) = _private_copy(text, split_special)
    special = _special_tokens(backend, config)
    bos_id = _token_id(backend, bos_name, prefix, _BOS_CANDIDATES, "bos_token", special)
    # whether the tokenizer's own post-processing starts every sequence with BOS (Llama,
    # Mistral, Gemma): a `special_tokens` policy without BOS is then warned of
    adds_bos = bos_id is not None and prefix[:1] == [bos_id]
    eos_id = _token_id(backend, eos_name, suffix, _EOS_CANDIDATES, "eos_token", special)
    return ResolvedTokenizer(
        backend=backend,
        bos_id=bos_id,
        eos_id=eos_id,
        digest=_digest(config, split_special_tokens=split_special),
        description=description,
        split_special_tokens=split_special,
        adds_bos=adds_bos,
        before=tuple(prefix),
    )


_Added = tuple[list[int], list[int]]  # the ids post-processing puts before and after a text
_COPIES: LruCache[tuple[Tokenizer, _Added]] = LruCache(8)


def _private_copy(text: str, split_special: bool) -> tuple[Tokenizer, _Added]:
    """The backend the pipeline encodes with, made from the tokenizer's JSON ``text``, and the
    ids its own post-processing puts before and after a text (read before that is removed).

    A private copy: the user's object keeps its truncation and padding settings, ours has
    none; nor post-processing: the pipeline adds BOS/EOS itself, and a ByteLevel
    post-processor trims whitespace off the offsets chat flags are read from (the ids are the
    same). One copy per tokenizer and process (the last 8 kept), shared by every pipeline:
    with tokenizers 0.23, a copy that encoded keeps 3-8 MB of native memory after it is
    dropped, so a job building a pipeline per evaluation or stage grew without bound.
    Encoding leaves a copy as it was, so sharing it changes nothing.
    """

    def make() -> tuple[Tokenizer, _Added]:
        backend = Tokenizer.from_str(text)
        backend.no_truncation()
        backend.no_padding()
        added = _added_ids(backend)
        backend.post_processor = None
        backend.encode_special_tokens = split_special
        return backend, added

    return _COPIES.get_or_load((hashlib.sha256(text.encode()).digest(), split_special), make)


def _added_ids(backend: Tokenizer) -> _Added:
    """The ids the post-processing puts before a text's own (``[bos]`` for Llama's; none for
    one that only appends EOS, even where BOS and EOS are one token), and after them. Probed
    with "a", or where the vocabulary cannot encode it (symbols without an unknown token) with
    the text of one of its first entries; none known where no probe encodes."""
    for probe in _probes(backend):
        try:
            whole = backend.encode(probe).ids
            own = backend.encode(probe, add_special_tokens=False).ids
        except Exception:  # tokenizers raises bare Exceptions
            continue
        if not own:
            continue
        for start in range(len(whole) - len(own) + 1):
            if whole[start : start + len(own)] == own:
                return whole[:start], whole[start + len(own) :]
        return [], []
    return [], []


def _probes(backend: Tokenizer) -> Iterator[str]:
    """The texts to probe with: "a", then those of the vocabulary's first `_PROBES` entries
    that are not added tokens."""
    yield "a"
    added = set(backend.get_added_tokens_decoder())
    entries = sorted(backend.get_vocab(with_added_tokens=False).values())
    for token_id in [i for i in entries if i not in added][:_PROBES]:
        text = backend.decode([token_id])
        if text.strip():
            yield text


def _special_tokens(backend: Tokenizer, config: dict[str, Any]) -> set[str]:
    """The tokens the tokenizer treats as special: those added to it, and those its own
    post-processing inserts (a converted tokenizer may keep "<s>" in the model's vocabulary
    and name it only there)."""
    found = {token.content for token in backend.get_added_tokens_decoder().values()}
    stack = [config.get("post_processor")]
    while stack:
        processor = stack.pop()
        if not isinstance(processor, dict):
            continue
        stack += processor.get("processors") or []  # a Sequence of processors
        named = processor.get("special_tokens")  # TemplateProcessing: {label: {"tokens"}}
        if isinstance(named, dict):
            for entry in named.values():
                tokens = entry.get("tokens") if isinstance(entry, dict) else None
                found.update(t for t in tokens or [] if isinstance(t, str))
        for key in ("cls", "sep"):  # BertProcessing, RobertaProcessing: [token, id]
            pair = processor.get(key)
            if isinstance(pair, list) and pair and isinstance(pair[0], str):
                found.add(pair[0])
    return found


def _digest(config: dict[str, Any], *, split_special_tokens: bool = False) -> str:
    """Hash of what in the tokenizer's JSON ``config`` decides the ids (post-processing,
    padding, truncation and decoding are never used: the pipeline adds BOS/EOS itself, and
    those ids are fingerprinted apart)."""
    relevant = {k: config.get(k) for k in ("added_tokens", "normalizer", "pre_tokenizer", "model")}
    if split_special_tokens:  # only when set, so the usual digests stay as they were
        relevant["split_special_tokens"] = True
    blob = json.dumps(relevant, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _read_tokenizer(file: Path) -> Tokenizer:
    """The ``tokenizers`` tokenizer saved in ``file``, else a ConfigError naming it."""
    try:
        return Tokenizer.from_file(str(file))
    except Exception as error:  # tokenizers raises a bare Exception for what it cannot parse
        raise ConfigError(
            f"cannot read tokenizer file {str(file)!r} (a tokenizers JSON file, as "
            f"`Tokenizer.save` or `save_pretrained` write it): {error}"
        ) from error


def _load(tokenizer_id: str) -> tuple[Any, str]:
    path = Path(tokenizer_id).expanduser()
    if path.is_file():
        backend = _read_tokenizer(path)
        if path.name == "tokenizer.json":  # a saved folder's file: the folder's BOS/EOS, as above
            return _with_config_tokens(backend, path.parent), str(path)
        return backend, str(path)
    if path.is_dir():
        file = path / "tokenizer.json"
        if not file.is_file():
            raise ConfigError(f"tokenizer directory {str(path)!r} has no tokenizer.json")
        backend = _read_tokenizer(file)
        return _with_config_tokens(backend, path), str(path)
    if _is_path(tokenizer_id):
        raise ConfigError(
            f"cannot load tokenizer {tokenizer_id!r}: no such file or directory (and a hub id "
            "reads 'org/name')"
        )
    return _from_hub(tokenizer_id), tokenizer_id


def _is_path(tokenizer_id: str) -> bool:
    """Whether ``tokenizer_id`` can only be a path, not a hub id (``name`` or ``org/name``):
    absolute, relative to ``.``, ``..`` or ``~``, deeper than ``org/name``, or a ``.json``."""
    return (
        os.path.isabs(tokenizer_id)
        or tokenizer_id.startswith(("./", "../", "~", ".\\"))
        or tokenizer_id.count("/") > 1
        or tokenizer_id.endswith(".json")
    )


def _from_hub(repo_id: str) -> Any:
    """A hub repository's ``tokenizer.json`` (through the hub cache, honouring
    ``HF_HUB_OFFLINE``); repositories without one go through transformers' converters."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    try:
        file = Path(hf_hub_download(repo_id, "tokenizer.json"))
        # optional; offline and not cached counts as absent too. The map is read only where
        # the config has no `added_tokens_decoder` (see `_with_config_tokens`)
        with contextlib.suppress(EntryNotFoundError):
            hf_hub_download(repo_id, _NAMING_FILES[0])
        if "added_tokens_decoder" not in (_json_file(file.parent / _NAMING_FILES[0]) or {}):
            with contextlib.suppress(EntryNotFoundError):
                hf_hub_download(repo_id, _NAMING_FILES[1])
        return _with_config_tokens(_read_tokenizer(file), file.parent)
    except ConfigError:  # its files are there, and one is unreadable
        raise
    except LocalEntryNotFoundError as exc:
        raise ConfigError(
            f"cannot load tokenizer {repo_id!r}: not a local path, and the local hub cache does "
            f"not have it while the hub is unreachable or HF_HUB_OFFLINE is set: {exc}"
        ) from exc
    except EntryNotFoundError:
        pass  # the repository has no tokenizer.json: let transformers convert its files
    except Exception as exc:  # the hub's errors for unknown repos, offline misses, no network
        raise ConfigError(
            f"cannot load tokenizer {repo_id!r}: not a local path, and the hub (or its local "
            f"cache) does not have it: {type(exc).__name__}: {exc}"
        ) from exc
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise ConfigError(
            f"tokenizer {repo_id!r} has no tokenizer.json; converting it needs transformers: "
            "pip install 'zephon-torch[transformers]'"
        ) from exc
    return AutoTokenizer.from_pretrained(repo_id, use_fast=True)


class _ConfiguredTokenizer:
    """A backend plus what its saved folder declares: BOS and EOS names, and whether text
    spelling a special token stays text (transformers' ``split_special_tokens``)."""

    def __init__(
        self, backend: Tokenizer, bos: str | None, eos: str | None, split_special: bool
    ) -> None:
        self.backend_tokenizer = backend
        self.bos_token = bos
        self.eos_token = eos
        self.split_special_tokens = split_special


def _with_config_tokens(backend: Tokenizer, directory: Path) -> Any:
    """``backend`` with what a saved folder declares, as transformers reads it: BOS and EOS
    names from ``tokenizer_config.json``, and where that has no ``added_tokens_decoder`` (a
    folder written before it), from ``special_tokens_map.json`` over it; and the config's
    ``split_special_tokens``."""
    config = _json_file(directory / _NAMING_FILES[0])
    if config is None:
        config = {}
    names = {key: _token_name(config.get(key)) for key in ("bos_token", "eos_token")}
    if "added_tokens_decoder" not in config:
        mapping = _json_file(directory / _NAMING_FILES[1]) or {}
        names = {key: _token_name(mapping.get(key)) or name for key, name in names.items()}
    split_special = config.get("split_special_tokens", backend.encode_special_tokens) is True
    if not any(names.values()) and not split_special:
        return backend
    return _ConfiguredTokenizer(backend, names["bos_token"], names["eos_token"], split_special)


def _json_file(file: Path) -> dict[str, Any] | None:
    """The JSON object in ``file``; None where there is no such file."""
    if not file.is_file():
        return None
    try:
        value = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ConfigError(f"cannot read {str(file)!r}: {error}") from error
    if not isinstance(value, dict):
        raise ConfigError(f"{str(file)!r} must hold a JSON object, got a {type(value).__name__}")
    return value


def _token_name(value: Any) -> str | None:
    """A token named as text, or as an object with its ``content``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _token_id(
    backend: Tokenizer,
    name: str | None,
    inserted: list[int],
    candidates: tuple[str, ...],
    argument: str,
    special: set[str],
) -> int | None:
    """The id of the token named ``name``; else the one special token the tokenizer's own
    post-processing ``inserted`` there (before a text for BOS, after it for EOS), whatever its
    name ("[BOS]", "<|bos|>"); else the first of the usual ``candidates`` among its special
    tokens."""
    if name is not None:
        if not isinstance(name, str):
            raise ConfigError(f"`{argument}` must be a token's text (a str), got {name!r}")
        token_id = backend.token_to_id(name)
        if token_id is None:
            raise ConfigError(f"`{argument}` {name!r} is not in the tokenizer's vocabulary")
        return int(token_id)
    if len(inserted) == 1 and backend.id_to_token(inserted[0]) in special:
        return inserted[0]
    # by name, only among its special tokens (`_special_tokens`): a BPE trained without
    # special tokens may have learned "</s>" as text, which no document should end with
    for candidate in candidates:
        token_id = backend.token_to_id(candidate)
        if candidate in special and token_id is not None:
            return int(token_id)
    return None
