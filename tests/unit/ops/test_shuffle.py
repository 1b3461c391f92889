"""Row shuffle: a permutation of the same rows, new per block, exact on resume."""

from __future__ import annotations

from typing import Any

from tests.helpers import assert_resumes_at_every_step, small_pipeline, two_sources

DATASETS = two_sources(40, 30, shard_size=8)


def rows_of(pipeline: Any) -> list[bytes]:
    return [row.tobytes() for batch in pipeline for row in batch.input_ids if batch.num_tokens]


def test_shuffle_emits_the_same_rows_in_another_order(tokenizer: Any) -> None:
    plain = rows_of(small_pipeline(tokenizer, datasets=DATASETS, microbatch_size=1))
    shuffled = rows_of(
        small_pipeline(tokenizer, datasets=DATASETS, microbatch_size=1).shuffle(8).batch(1)
    )
    assert sorted(plain) == sorted(shuffled)
    assert plain != shuffled
    # rows stay within their block of 8
    for start in range(0, len(plain) - len(plain) % 8, 8):
        assert sorted(plain[start : start + 8]) == sorted(shuffled[start : start + 8])


def test_each_block_gets_its_own_order(tokenizer: Any) -> None:
    from zephon_torch.work._hashing import stable_key
    from zephon_torch.work._permutation import permute

    orders = {
        tuple(permute(range(8), 8, stable_key(7, "shuffle", 0, b)).tolist()) for b in range(6)
    }
    assert len(orders) == 6


def test_shuffle_with_best_fit_resumes_at_every_step(tokenizer: Any) -> None:
    def build() -> Any:
        base = small_pipeline(
            tokenizer, algorithm="best_fit", datasets=two_sources(20, 16, shard_size=6)
        )
        return base.shuffle(5)

    assert_resumes_at_every_step(build)


def test_shuffle_in_repeat_mode_resumes_at_every_step(tokenizer: Any) -> None:
    def build() -> Any:
        base = small_pipeline(
            tokenizer, exhaustion="repeat", lanes=2, datasets=two_sources(8, 6, shard_size=3)
        )
        return base.shuffle(4)

    assert_resumes_at_every_step(build, max_steps=30)
