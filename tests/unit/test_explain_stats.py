"""explain() names the plan; stats() counts what was delivered and where time went."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.helpers import small_pipeline, two_sources
from zephon_torch.io import Dataset


def test_explain_separates_the_recipe_from_performance_knobs(tokenizer: Any) -> None:
    from zephon_torch import Pipeline
    from zephon_torch.work import StaticMixtureWorkSource

    text = small_pipeline(tokenizer, lanes=8, world_size=4, rank=3, algorithm="best_fit").explain(
        num_workers=2
    )
    recipe, knobs = text.split("performance knobs")
    assert "canonical_replicas L=8" in recipe and "dataset 'long': 60.0% target" in recipe
    assert "5 shards, 60 rows" in recipe  # 60 rows in shards of 13
    single = [Dataset.from_dict(n, {"text": ["a b"]}) for n in ("long", "short")]
    # not "1 shards, 1 rows"
    assert "memory, 1 shard, 1 row\n" in small_pipeline(tokenizer, datasets=single).explain()
    skewed = StaticMixtureWorkSource(single, {"long": 3, "short": 0.001}, seed=7)
    text = Pipeline(skewed).tokenize(tokenizer=tokenizer).pack_flat(64).batch(2).explain()
    assert "dataset 'short': 0.033% target" in text  # not "0.0% target"
    assert "dataset 'long': 100.0% target" in text
    payloads = [Dataset.from_dict(n, {"text": ["a b"], "meta": [1]}) for n in ("long", "short")]
    sequences = StaticMixtureWorkSource(payloads, seed=7)
    recipe_of = Pipeline(sequences).tokenize(tokenizer=tokenizer)
    shown = recipe_of.pack_sequences(64, payload_fields=["meta"]).batch(2).explain()
    assert "mix+pack_sequences(best_fit, max_length=64, num_bins=8, payload_fields=['meta'])" in (
        shown
    )  # it read as pack_flat's line, the payloads unsaid
    assert "fetch -> tokenize(field='text', special_tokens='eos')" in recipe
    # every packing setting in the fingerprint (num_bins was left out: trial C)
    assert "mix+pack(best_fit, max_length=64, num_bins=8)" in recipe
    assert "rank 3 of 4: lanes 6..7" in knobs and "DataLoader workers: 2 of 2 used" in knobs
    assert "runner: threads x 2" in knobs


def test_explain_names_the_inline_runner_and_the_prefetch_auto_chooses(tokenizer: Any) -> None:
    from zephon_torch import ConfigError, Pipeline
    from zephon_torch.io import Dataset
    from zephon_torch.work import StaticMixtureWorkSource

    dataset = Dataset.from_dict("ids", {"ids": [[1, 2, 3], [4, 5]]})
    base = Pipeline(StaticMixtureWorkSource([dataset]))
    pipeline = base.pretokenized("ids").pack_flat(4)
    knobs = pipeline.batch(1).explain().split("performance knobs")[1]
    assert "runner: inline (the packer's thread)" in knobs
    assert "prefetch: none (micro-batches are made as the consumer asks)" in knobs
    assert knobs.rstrip().endswith("(auto: pre-tokenized data)")
    threads = base.options(prefetch=0).pretokenized("ids", runner="threads").pack_flat(4).batch(1)
    assert (
        threads.options(prefetch="auto").explain().rstrip().endswith("(auto: pre-tokenized data)")
    )
    assert (
        "prefetch: none (micro-batches are made as the consumer asks)\n" in threads.explain() + "\n"
    )
    back = threads.options(prefetch=8)
    assert "prefetch: 8 micro-batches on a background thread\n" in back.explain() + "\n"
    assert (
        "prefetch: 8 micro-batches on a background thread (auto)"
        in small_pipeline(tokenizer, prefetch="auto").explain()
    )
    inline = pipeline.batch(1)
    assert list(inline) and inline._live is None  # no prefetch thread was started
    assert list(back) and back._live is not None
    for bad in (-1, "soon", 2.5):
        with pytest.raises(ConfigError, match="`prefetch` must be 'auto' or an int >= 0"):
            pipeline.options(prefetch=bad)  # type: ignore[arg-type]


def test_stats_agree_with_the_delivered_batches(tokenizer: Any) -> None:
    pipeline = small_pipeline(tokenizer, algorithm="best_fit", lanes=2)
    batches = list(pipeline)
    stats = pipeline.stats()
    tokens = sum(b.num_tokens for b in batches)
    capacity = sum(b.input_ids.size for b in batches)
    assert stats["batches"] == len(batches)
    assert stats["tokens"] == tokens == sum(stats["tokens_by_source"].values())
    assert stats["padding_fraction"] == pytest.approx(1 - tokens / capacity)
    assert sum(stats["delivered_shares"].values()) == pytest.approx(1)
    assert stats["shares_of"] == "tokens"
    assert stats["target_shares"] == {"long": pytest.approx(0.6), "short": pytest.approx(0.4)}
    ops = stats["operators"]
    assert set(ops) == {"fetch", "tokenize"} and ops["tokenize"]["documents"] == 100
    assert sum(op["time_share"] for op in ops.values()) == pytest.approx(1)
    assert stats["state_bytes"] > 0 and stats["stalls"]["consumer_waited_s"] >= 0
    # the figures of an iteration that ended stay (its time kept running, its rate falling)
    time.sleep(0.05)
    later = pipeline.stats()
    assert (later["elapsed_s"], later["tokens_per_s"]) == (
        stats["elapsed_s"],
        stats["tokens_per_s"],
    )


def test_operator_figures_of_processes_are_none_not_zeros(tokenizer: Any) -> None:
    """The processes runner's operators run, and count, in its processes: stats() read their
    seconds and documents here as 0, as though nothing had been tokenized."""
    import itertools

    pipeline = small_pipeline(tokenizer, runner="processes", parallelism=1)
    assert len(list(itertools.islice(pipeline, 4))) == 4
    stats = pipeline.stats()
    assert stats["operators"] is None and stats["tokens"] > 0


def test_skipped_documents_are_reported(tokenizer: Any) -> None:
    from zephon_torch import Pipeline
    from zephon_torch.work import StaticMixtureWorkSource

    source = StaticMixtureWorkSource(two_sources(), {"long": 0.6, "short": 0.4}, seed=7)
    pipeline = (
        Pipeline(source)
        .tokenize(tokenizer=tokenizer)
        .pack_flat(32, "best_fit", long_documents="drop")
        .batch(2)
    )
    list(pipeline)
    assert pipeline.stats()["skipped_documents"]["too_long"] > 0


def test_the_stats_hook_runs_every_n_batches(tokenizer: Any) -> None:
    seen: list[int] = []
    pipeline = small_pipeline(tokenizer).options(
        stats_every=5, on_stats=lambda s: seen.append(s["batches"])
    )
    n = len(list(pipeline))
    assert seen == list(range(5, n + 1, 5))
    # stats_every=0 turns the hook off (it was a ConfigError: on_stats=None means unchanged)
    seen.clear()
    off = pipeline.options(stats_every=0)
    assert len(list(off)) == n and seen == []
    assert len(list(pipeline.options(stats_every=0, stats=False))) == n and seen == []


def test_a_stats_hook_that_raises_loses_no_batch(tokenizer: Any) -> None:
    """The batch's state was recorded as delivered before the hook ran: a hook that raised
    (a metrics server down) dropped that batch from the stream that went on after it."""
    from tests.helpers import keys

    whole = keys(small_pipeline(tokenizer, lanes=2))
    calls = []

    def hook(stats: dict[str, Any]) -> None:
        calls.append(stats["batches"])
        if len(calls) == 2:
            raise ConnectionError("metrics server down")

    pipeline = small_pipeline(tokenizer, lanes=2).options(stats_every=3, on_stats=hook)
    got = []
    with pytest.raises(ConnectionError):
        for batch in pipeline:
            got.append(batch)
    assert len(got) == 5
    state = pipeline.state_dict()
    resumed = small_pipeline(tokenizer, lanes=2)
    resumed.load_state_dict(state)
    assert keys(got) + keys(resumed) == whole
    assert keys(got) + keys(pipeline) == whole


def test_stats_can_be_switched_off_without_changing_the_data(tokenizer: Any) -> None:
    from tests.helpers import keys
    from zephon_torch import ConfigError

    off = small_pipeline(tokenizer, lanes=2).options(stats=False)
    assert keys(off) == keys(small_pipeline(tokenizer, lanes=2))
    assert off.stats()["batches"] == 0
    with pytest.raises(ConfigError):
        small_pipeline(tokenizer).options(stats=False, stats_every=3)


def test_delivered_shares_are_of_documents_where_the_targets_are() -> None:
    """Without token estimation the targets are document shares, but the delivered shares
    were of tokens: a mixture held exactly at 50:50 documents read 0.98:0.02."""
    import itertools

    from zephon_torch import Pipeline
    from zephon_torch.io import Dataset
    from zephon_torch.work import StaticMixtureWorkSource

    long = Dataset.from_dict("long", {"ids": [[7] * (200 + i % 200) for i in range(300)]})
    short = Dataset.from_dict("short", {"ids": [[9] * (5 + i % 5) for i in range(300)]})
    source = StaticMixtureWorkSource([long, short], seed=0, exhaustion="repeat")
    pipeline = Pipeline(source).pretokenized("ids").pack_flat(256).batch(2)
    begun = {"long": 0, "short": 0}
    for batch in itertools.islice(pipeline, 100):
        for row_sources, row_starts in zip(batch.row_sources(), batch.starts_document):
            for name, start in zip(row_sources, row_starts):
                begun[name] += start
    stats = pipeline.stats()
    assert stats["shares_of"] == "documents"
    total = sum(begun.values())
    assert stats["delivered_shares"] == {name: n / total for name, n in begun.items()}
    assert abs(stats["delivered_shares"]["short"] - 0.5) < 0.02
    assert stats["tokens_by_source"]["long"] > 10 * stats["tokens_by_source"]["short"]
    tokens = stats["tokens_by_source"]
    assert stats["token_shares"] == {name: n / sum(tokens.values()) for name, n in tokens.items()}
    assert stats["token_shares"]["short"] < 0.05  # what training sees, beside the targets'


def test_token_shares_are_the_delivered_shares_where_the_targets_are_of_tokens(
    tokenizer: Any,
) -> None:
    import itertools

    pipeline = small_pipeline(tokenizer)
    for _ in itertools.islice(pipeline, 20):
        pass
    stats = pipeline.stats()
    assert stats["shares_of"] == "tokens"
    assert stats["token_shares"] == stats["delivered_shares"]
    assert set(stats["token_shares"]) == {"long", "short"}
    assert 0 < stats["token_shares"]["short"] < 1
