from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from zephon_torch import _corpus
from zephon_torch.errors import ConfigError

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    cache = tmp_path / "cache"
    monkeypatch.setenv("ZEPHON_TORCH_CACHE", str(cache))
    return cache


def read_shards(paths: list[pathlib.Path]) -> list[dict[str, str]]:
    docs: list[dict[str, str]] = []
    for path in paths:
        docs.extend(json.loads(line) for line in path.read_text(encoding="utf-8").splitlines())
    return docs


def snapshot(root: pathlib.Path) -> dict[str, tuple[int, bytes]]:
    return {
        p.relative_to(root).as_posix(): (p.stat().st_mtime_ns, p.read_bytes())
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_cache_dir_follows_the_environment_variable_and_is_created(
    isolated_cache: pathlib.Path,
) -> None:
    assert not isolated_cache.exists()
    assert _corpus.cache_dir() == isolated_cache
    assert isolated_cache.is_dir()


def test_stdlib_code_documents_are_non_empty_sorted_and_stop_at_the_byte_limit() -> None:
    docs = _corpus.stdlib_code_documents(limit_bytes=1_000_000)
    ids = [doc["id"] for doc in docs]
    assert ids == sorted(ids)
    assert all(doc["text"] and doc["id"].endswith(".py") for doc in docs)
    assert not any(part in doc_id for doc_id in ids for part in ("site-packages/", "__pycache__/"))
    sizes = [len(doc["text"].encode("utf-8")) for doc in docs]
    assert sum(sizes) >= 1_000_000 > sum(sizes[:-1])


def test_pydoc_prose_documents_are_non_empty_and_sorted_by_topic() -> None:
    docs = _corpus.pydoc_prose_documents()
    ids = [doc["id"] for doc in docs]
    assert len(docs) > 10
    assert ids == sorted(ids)
    assert all(doc["text"].strip() for doc in docs)


def test_extra_text_documents_reads_text_files_of_each_root_in_order_up_to_the_limit(
    tmp_path: pathlib.Path,
) -> None:
    first, second = tmp_path / "b_root", tmp_path / "a_root"
    for path, text in [
        (first / "z.md", "zz"),
        (first / "pkg" / "mod.py", "x = 1\n"),
        (first / "pkg" / "data.bin", "binary"),
        (first / "__pycache__" / "mod.py", "cached"),
        (first / "a.rst", "b\xe9ta"),
        (second / "notes.txt", "never read"),
        (second / "more.txt", "read last"),
    ]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    docs = _corpus.extra_text_documents([first, second], limit_bytes=20)
    assert [(pathlib.Path(d["id"]).relative_to(tmp_path).as_posix(), d["text"]) for d in docs] == [
        ("b_root/a.rst", "b\xe9ta"),
        ("b_root/pkg/mod.py", "x = 1\n"),
        ("b_root/z.md", "zz"),
        ("a_root/more.txt", "read last"),
    ]


def test_write_jsonl_shards_round_trips_all_docs_in_order_across_shards(
    tmp_path: pathlib.Path,
) -> None:
    docs = [{"id": f"doc-{i}", "text": f"line {i}\nsnowman \u2603 {'x' * i}"} for i in range(23)]
    paths = _corpus.write_jsonl_shards(docs, tmp_path / "out", num_shards=5)
    assert [p.name for p in paths] == [f"part-{i:05d}.jsonl" for i in range(5)]
    assert read_shards(paths) == docs
    counts = [len(read_shards([p])) for p in paths]
    assert max(counts) - min(counts) <= 1
    assert "\u2603" in paths[0].read_text(encoding="utf-8")
    assert not [p for p in (tmp_path / "out").iterdir() if p not in paths]


def test_write_jsonl_shards_writes_empty_shards_when_docs_are_fewer_than_shards(
    tmp_path: pathlib.Path,
) -> None:
    docs = [{"id": "only", "text": "one"}]
    paths = _corpus.write_jsonl_shards(docs, tmp_path, num_shards=3)
    assert read_shards(paths) == docs
    assert sum(p.stat().st_size == 0 for p in paths) == 2


def test_write_jsonl_shards_refuses_a_non_positive_shard_count(tmp_path: pathlib.Path) -> None:
    with pytest.raises(ConfigError, match="`num_shards` must be positive, got 0"):
        _corpus.write_jsonl_shards([], tmp_path, num_shards=0)


def test_demo_corpus_builds_once_and_the_second_call_rewrites_nothing(
    isolated_cache: pathlib.Path,
) -> None:
    code_dir, prose_dir = _corpus.demo_corpus()
    root = code_dir.parent
    assert root.parent == isolated_cache / "demo"
    assert len(root.name) == 12 and prose_dir.parent == root
    code_paths = sorted(code_dir.glob("part-*.jsonl"))
    prose_paths = sorted(prose_dir.glob("part-*.jsonl"))
    assert (len(code_paths), len(prose_paths)) == (8, 2)
    code = read_shards(code_paths)
    assert [d["id"] for d in code] == [d["id"] for d in _corpus.stdlib_code_documents()]
    assert read_shards(prose_paths) == _corpus.pydoc_prose_documents()
    before = snapshot(root)
    assert _corpus.demo_corpus() == (code_dir, prose_dir)
    assert snapshot(root) == before


def test_a_half_built_corpus_without_its_marker_is_rebuilt(tmp_path: pathlib.Path) -> None:
    code_dir, _ = _corpus.demo_corpus(tmp_path / "demo")
    complete = {p: p.read_bytes() for p in (tmp_path / "demo").rglob("*") if p.is_file()}
    markers = [p for p in complete if p.parent == tmp_path / "demo"]
    assert len(markers) == 1
    # A crash mid-build: the marker is missing, one shard is truncated and another never landed.
    markers[0].unlink()
    (code_dir / "part-00003.jsonl").write_text('{"id": "trunc', encoding="utf-8")
    (code_dir / "part-00007.jsonl").unlink()
    _corpus.demo_corpus(tmp_path / "demo")
    assert {p: p.read_bytes() for p in complete} == complete


def test_small_tokenizer_decodes_a_sentence_back_exactly_and_has_end_of_text_as_id_0(
    tmp_path: pathlib.Path,
) -> None:
    path = tmp_path / "tok" / "small.json"
    tokenizer = _corpus.small_tokenizer(path)
    assert tokenizer.token_to_id("<|endoftext|>") == 0
    assert tokenizer.get_vocab_size() == 1024
    sentence = "  The quick brown fox, déjà vu: naïve \u2603 code\tx = f(y)\n"
    ids = tokenizer.encode(sentence).ids
    assert tokenizer.decode(ids) == sentence
    assert tokenizer.encode("<|endoftext|>").ids == [0]
    # The second call loads the saved file instead of training.
    mtime = path.stat().st_mtime_ns
    assert _corpus.small_tokenizer(path).to_str() == tokenizer.to_str()
    assert path.stat().st_mtime_ns == mtime


def test_training_twice_gives_identical_tokenizer_json_even_in_another_process() -> None:
    texts = [doc["text"] for doc in _corpus.pydoc_prose_documents()]
    first = _corpus.train_bpe_tokenizer(texts, vocab_size=2048).to_str()
    assert _corpus.train_bpe_tokenizer(iter(texts), vocab_size=2048).to_str() == first
    # Another process has another hash seed and, with one thread, another schedule.
    script = (
        "import sys; from zephon_torch import _corpus; "
        "texts = [d['text'] for d in _corpus.pydoc_prose_documents()]; "
        "sys.stdout.write(_corpus.train_bpe_tokenizer(texts, vocab_size=2048).to_str())"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "RAYON_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    )
    assert result.stdout == first


def test_train_bpe_tokenizer_refuses_a_vocabulary_smaller_than_the_byte_alphabet() -> None:
    with pytest.raises(ConfigError, match="`vocab_size` must be at least 257, got 100"):
        _corpus.train_bpe_tokenizer(["text"], vocab_size=100)


def test_demo_tokenizer_is_cached_beside_the_corpus_and_loaded_on_the_second_call() -> None:
    tokenizer, path = _corpus.demo_tokenizer(vocab_size=2048)
    assert path.name == "tokenizer-2048.json"
    assert path.parent == _corpus.demo_corpus()[0].parent
    assert path.read_text(encoding="utf-8") == tokenizer.to_str()
    code = "def main() -> None:\n    print('hello')\n"
    assert tokenizer.decode(tokenizer.encode(code).ids) == code
    mtime = path.stat().st_mtime_ns
    again, same_path = _corpus.demo_tokenizer(vocab_size=2048)
    assert (again.to_str(), same_path, path.stat().st_mtime_ns) == (tokenizer.to_str(), path, mtime)
