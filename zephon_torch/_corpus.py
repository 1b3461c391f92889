"""Offline corpora and tokenizers built from what every Python installation ships.

Code is the standard library's ``.py`` files (CPython 3.11: 1,790 documents, 31.5 MB), prose the
``pydoc_data`` topics (79 documents, 0.47 MB). Everything is cached under :func:`cache_dir`, keyed
by the Python build, and is a pure function of it: one machine always yields the same shard and
tokenizer bytes. Files appear atomically and a marker written last tells a finished corpus from a
half-built one. Trade-off: small, Python-flavoured text; fine for pipelines, not for judging models.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import sys
import sysconfig
from collections.abc import Iterable, Iterator, Mapping, Sequence

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from zephon_torch._atomic import write_text_atomically
from zephon_torch.errors import ConfigError

__all__ = [
    "cache_dir",
    "demo_corpus",
    "demo_tokenizer",
    "extra_text_documents",
    "pydoc_prose_documents",
    "small_tokenizer",
    "stdlib_code_documents",
    "train_bpe_tokenizer",
    "write_jsonl_shards",
]

END_OF_TEXT = "<|endoftext|>"
# Bump when the corpus recipe changes so caches built by older code are not reused.
_RECIPE_VERSION = 1
_MARKER = "COMPLETE.json"
_CODE_SHARDS = 8
_PROSE_SHARDS = 2
_TOKENIZER_CODE_BYTES = 4_000_000
_STDLIB_SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})
_EXTRA_SUFFIXES = frozenset({".py", ".md", ".rst", ".txt"})
_EXTRA_SKIPPED_DIRS = frozenset({"__pycache__"})


def cache_dir() -> pathlib.Path:
    """Returns ``$ZEPHON_TORCH_CACHE`` or ``~/.cache/zephon_torch``, creating it on demand."""
    env = os.environ.get("ZEPHON_TORCH_CACHE")
    path = pathlib.Path(env) if env else pathlib.Path.home() / ".cache" / "zephon_torch"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _corpus_key() -> str:
    """A short hash of the Python build and stdlib path: another Python gets its own corpus."""
    stdlib = sysconfig.get_paths()["stdlib"]
    material = f"{_RECIPE_VERSION}\0{sys.version}\0{stdlib}"
    return hashlib.sha256(material.encode("utf-8")).hexdigest()[:12]


def _sorted_files(
    root: pathlib.Path, suffixes: frozenset[str], skipped_dirs: frozenset[str]
) -> list[tuple[str, pathlib.Path]]:
    """Files under ``root`` ending in ``suffixes`` as sorted (relative posix path, path) pairs."""
    found: list[tuple[str, pathlib.Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in skipped_dirs]
        for name in filenames:
            path = pathlib.Path(dirpath, name)
            if path.suffix in suffixes and path.is_file():
                found.append((path.relative_to(root).as_posix(), path))
    found.sort()
    return found


def _read_files(files: Iterable[tuple[str, pathlib.Path]]) -> Iterator[dict[str, str]]:
    """Yields ``{"id", "text"}`` per file: UTF-8 with ``errors="replace"``, newlines untouched."""
    for doc_id, path in files:
        try:
            text = path.read_bytes().decode("utf-8", errors="replace")
        except OSError:
            continue  # An unreadable file (e.g. a dangling link) should not break the demo.
        yield {"id": doc_id, "text": text}


def _take_bytes(docs: Iterable[dict[str, str]], limit_bytes: int | None) -> list[dict[str, str]]:
    """Takes documents until ``limit_bytes`` of UTF-8 text were collected (None: all).

    The document that reaches the limit is kept, so the total is >= ``limit_bytes`` if there is
    enough text; later documents are never read.
    """
    if limit_bytes is not None and limit_bytes < 0:
        raise ConfigError(f"`limit_bytes` must be non-negative or None, got {limit_bytes}")
    taken: list[dict[str, str]] = []
    total = 0
    for doc in docs:
        if limit_bytes is not None and total >= limit_bytes:
            break
        taken.append(doc)
        total += len(doc["text"].encode("utf-8"))
    return taken


def stdlib_code_documents(limit_bytes: int | None = None) -> list[dict[str, str]]:
    """The standard library's ``.py`` files as ``{"id": relative path, "text": contents}``.

    Args:
        limit_bytes: Stop once this many bytes of UTF-8 text were collected; None reads all
            (~30 MB). ``site-packages/``, ``dist-packages/`` and ``__pycache__/`` are skipped.

    Returns:
        Documents sorted by relative path.
    """
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = _sorted_files(root, frozenset({".py"}), _STDLIB_SKIPPED_DIRS)
    return _take_bytes(_read_files(files), limit_bytes)


def pydoc_prose_documents() -> list[dict[str, str]]:
    """One document per ``pydoc_data.topics`` topic, ``{"id": name, "text": text}``, by name."""
    from pydoc_data.topics import topics

    return [{"id": name, "text": topics[name]} for name in sorted(topics)]


def extra_text_documents(roots: Sequence[pathlib.Path], limit_bytes: int) -> list[dict[str, str]]:
    """``.py``/``.md``/``.rst``/``.txt`` files under ``roots``, e.g. site-packages for >= 50 MB.

    Args:
        roots: Folders to walk in the given order; within each, files are sorted by path.
            ``__pycache__/`` is skipped; roots that do not exist contribute nothing.
        limit_bytes: Stop once this many bytes of UTF-8 text were collected.

    Returns:
        Documents whose ``id`` is the absolute posix path, so ids stay unique across roots.
    """
    files = (
        (path.absolute().as_posix(), path)
        for root in roots
        for _, path in _sorted_files(pathlib.Path(root), _EXTRA_SUFFIXES, _EXTRA_SKIPPED_DIRS)
    )
    return _take_bytes(_read_files(files), limit_bytes)


def write_jsonl_shards(
    docs: Sequence[Mapping[str, str]], out_dir: pathlib.Path, *, num_shards: int
) -> list[pathlib.Path]:
    """Writes ``docs`` as contiguous slices into ``out_dir/part-00000.jsonl`` and onward.

    Shard ``i`` holds ``docs[i * n // k : (i + 1) * n // k]``: shard sizes differ by at most one
    document, reading shards in name order gives ``docs`` back, and all ``k`` are written (empty
    if ``n < k``). Lines are ``json.dumps(doc, ensure_ascii=False)``; files appear atomically.

    Args:
        docs: Documents to write.
        out_dir: Folder to write into, created if missing.
        num_shards: How many shard files to write; must be positive.

    Returns:
        The shard paths in order.
    """
    if num_shards <= 0:
        raise ConfigError(f"`num_shards` must be positive, got {num_shards}")
    out_dir.mkdir(parents=True, exist_ok=True)
    n = len(docs)
    paths = [out_dir / f"part-{i:05d}.jsonl" for i in range(num_shards)]
    for i, path in enumerate(paths):
        part = docs[i * n // num_shards : (i + 1) * n // num_shards]
        lines = [json.dumps(dict(doc), ensure_ascii=False) + "\n" for doc in part]
        write_text_atomically(path, "".join(lines))
    return paths


def _read_jsonl_dir(directory: pathlib.Path) -> list[dict[str, str]]:
    """Every document of ``directory/part-*.jsonl``, in shard then line order."""
    docs: list[dict[str, str]] = []
    for path in sorted(directory.glob("part-*.jsonl")):
        with open(path, encoding="utf-8") as f:
            docs.extend(json.loads(line) for line in f)
    return docs


def demo_corpus(root: pathlib.Path | None = None) -> tuple[pathlib.Path, pathlib.Path]:
    """The demo corpus: stdlib code in 8 JSONL shards and pydoc prose in 2, built once.

    A marker written after every shard makes later calls return at once; without it the shards
    are rewritten. Concurrent first builds are safe: they write the same bytes, each atomically.

    Args:
        root: Folder to build in; default ``cache_dir() / "demo" / <key>``, where ``<key>`` hashes
            the Python version and stdlib path.

    Returns:
        ``(code_dir, prose_dir)``.
    """
    root = cache_dir() / "demo" / _corpus_key() if root is None else root
    code_dir, prose_dir, marker = root / "code", root / "prose", root / _MARKER
    if marker.is_file():
        return code_dir, prose_dir
    code = stdlib_code_documents()
    prose = pydoc_prose_documents()
    write_jsonl_shards(code, code_dir, num_shards=_CODE_SHARDS)
    write_jsonl_shards(prose, prose_dir, num_shards=_PROSE_SHARDS)
    summary: dict[str, object] = {"recipe_version": _RECIPE_VERSION, "python": sys.version}
    for name, docs in (("code", code), ("prose", prose)):
        summary[f"{name}_docs"] = len(docs)
        summary[f"{name}_bytes"] = sum(len(d["text"].encode("utf-8")) for d in docs)
    write_text_atomically(marker, json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return code_dir, prose_dir


def train_bpe_tokenizer(
    texts: Iterable[str], *, vocab_size: int = 8192, path: pathlib.Path | None = None
) -> tokenizers.Tokenizer:
    """A byte-level BPE tokenizer with ``"<|endoftext|>"`` as id 0, loaded from ``path`` if there.

    Training is deterministic for given texts, no setting needed: measured with tokenizers 0.23,
    ``to_str()`` is byte-identical across processes (each with its own hash seed) and for
    ``RAYON_NUM_THREADS`` 1, 2, 8 and 16, since word counts are summed (order-free) and the
    trainer breaks ties between equally frequent pairs by token id.

    Args:
        texts: Training texts; only used when training.
        vocab_size: Target vocabulary size including the 256 byte symbols and the special token.
        path: Cache file; if it exists it is loaded as is (its vocabulary size is not checked),
            otherwise the trained tokenizer is saved there atomically.

    Returns:
        The tokenizer.
    """
    if path is not None and path.is_file():
        return tokenizers.Tokenizer.from_file(str(path))
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size < len(alphabet) + 1:
        raise ConfigError(f"`vocab_size` must be at least {len(alphabet) + 1}, got {vocab_size}")
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomically(path, tokenizer.to_str())
    return tokenizer


def _tokenizer_sample(code_dir: pathlib.Path, prose_dir: pathlib.Path) -> list[str]:
    """All prose plus ~4 MB of code picked by a hash of each id, so it spans the whole stdlib."""
    code = _read_jsonl_dir(code_dir)
    code.sort(key=lambda doc: hashlib.sha256(doc["id"].encode("utf-8")).hexdigest())
    docs = _read_jsonl_dir(prose_dir) + _take_bytes(code, _TOKENIZER_CODE_BYTES)
    return [doc["text"] for doc in docs]


def demo_tokenizer(
    root: pathlib.Path | None = None, vocab_size: int = 8192
) -> tuple[tokenizers.Tokenizer, pathlib.Path]:
    """The demo's tokenizer, trained on all prose and ~4 MB of code of :func:`demo_corpus`.

    Args:
        root: The corpus folder, as for :func:`demo_corpus`; holds ``tokenizer-<vocab_size>.json``.
        vocab_size: Target vocabulary size.

    Returns:
        ``(tokenizer, path to its tokenizer.json)``.
    """
    root = cache_dir() / "demo" / _corpus_key() if root is None else root
    path = root / f"tokenizer-{vocab_size}.json"
    if path.is_file():
        return tokenizers.Tokenizer.from_file(str(path)), path
    texts = _tokenizer_sample(*demo_corpus(root))
    return train_bpe_tokenizer(texts, vocab_size=vocab_size, path=path), path


def small_tokenizer(path: pathlib.Path, vocab_size: int = 1024) -> tokenizers.Tokenizer:
    """A tiny tokenizer for tests, trained on pydoc prose only (< 1 s) and cached at ``path``."""
    texts = (doc["text"] for doc in pydoc_prose_documents())
    return train_bpe_tokenizer(texts, vocab_size=vocab_size, path=path)
