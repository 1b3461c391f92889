"""Shared fixtures: a real BPE tokenizer trained locally, small real-text datasets, and moto's S3
server with a per-test cache folder for the S3 tests."""

from __future__ import annotations

import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path

# One torch thread per process, set before torch is imported: two test workers (and their
# DataLoader workers and torchrun ranks) share the machine's cores, and OpenMP threads that
# spin waiting for a busy core slowed a small model's steps some thirtyfold.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
from tokenizers import Tokenizer

from zephon_torch._corpus import pydoc_prose_documents, small_tokenizer
from zephon_torch._moto import moto_server

os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")


@pytest.fixture(scope="session")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    """A 1024-token byte-level BPE trained on the pydoc topics (well under a second)."""
    return small_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


def prose_documents(
    count: int, *, seed: int, min_words: int = 3, max_words: int = 400
) -> list[str]:
    """``count`` documents of real English of varied length, cut from the pydoc topics."""
    words = " ".join(d["text"] for d in pydoc_prose_documents()).split()
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        n = rng.randint(min_words, max_words)
        start = rng.randrange(0, len(words) - n)
        out.append(" ".join(words[start : start + n]))
    return out


@pytest.fixture
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Keeps the default shard cache and index folder (remembered row counts) per test;
    returns that index folder."""
    cache = tmp_path / "_cache"
    monkeypatch.setenv("ZEPHON_TORCH_CACHE", str(cache))
    return cache / "index"


@pytest.fixture
def s3_server() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """moto's standalone S3 server on loopback: its endpoint and its process."""
    with moto_server() as running:
        yield running
