"""Parquet row groups: a shuffled read decodes each group once (a cache weighed by the decoded
columns, reported once where the window does not fit, with a bounded decode log), and shards
above the block size are split into runs of row groups that windows are made of."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon_torch.io import Dataset


@pytest.mark.parametrize("groups", [300, 3000])
def test_rows_drawn_at_random_from_many_small_row_groups_decode_each_group_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, groups: int
) -> None:
    """Short documents make many row groups per shuffle window: as long as they fit the
    cache's byte bound, each is decoded once however the window's rows are drawn. A bound of
    1,024 groups as well decoded each of 3,000 groups (under 200 KiB of ids) 3 times."""
    from zephon_torch.io.parquet import ParquetReader

    per_group = 4
    table = pa.table({"ids": [[i, i + 1] for i in range(groups * per_group)]})
    pq.write_table(table, tmp_path / "part-0.parquet", row_group_size=per_group)
    decoded: list[int] = []
    decode = ParquetReader._decode

    def counted(self: ParquetReader, path: str, opened: object, group: int) -> object:
        decoded.append(group)
        return decode(self, path, opened, group)  # type: ignore[arg-type]

    monkeypatch.setattr(ParquetReader, "_decode", counted)
    dataset = Dataset.from_path("d", tmp_path, token_columns=["ids"])
    order = np.random.default_rng(0).permutation(groups * per_group)
    for start in range(0, len(order), 32):  # a chunk of 32 documents at a time
        rows = order[start : start + 32]
        got = dataset.read_rows(0, rows)
        assert [int(r["ids"][0]) for r in got] == rows.tolist()
    assert sorted(decoded) == list(range(groups))


def test_a_row_group_cache_too_small_for_the_window_is_reported_once(tmp_path: Path) -> None:
    import warnings

    from zephon_torch.io.parquet import ParquetReader

    groups, per_group = 300, 16
    table = pa.table({"x": list(range(groups * per_group))})
    path = str(tmp_path / "part-0.parquet")
    pq.write_table(table, path, row_group_size=per_group)
    # rows drawn at random within windows of 30 groups, window after window, as a shuffle
    # window of shards draws them; a cache of one group decodes one for almost every row
    window = 30 * per_group
    rng = np.random.default_rng(0)
    rows = np.concatenate(
        [start + rng.permutation(window) for start in range(0, groups * per_group, window)]
    )
    small = ParquetReader(dataset="web", max_row_group_bytes=1)
    with pytest.warns(UserWarning, match="dataset 'web': Parquet row groups are decoded again"):
        for start in range(0, len(rows), 8):
            small.read(path, rows[start : start + 8])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once only
        for start in range(0, len(rows), 8):
            small.read(path, rows[start : start + 8])
    # in order, pass after pass, each group is decoded once a pass: nothing to report
    ordered = ParquetReader(dataset="web", max_row_group_bytes=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(4):
            for start in range(0, groups * per_group, 32):
                ordered.read(path, np.arange(start, min(start + 32, groups * per_group)))


def test_the_decode_log_stays_quiet_over_many_shuffled_passes_that_fit() -> None:
    """Each pass decodes every group once, its windows in a new order: the last window of a
    pass may come first in the next, re-decoding a few groups early, pass after pass."""
    from zephon_torch.io.parquet import _DecodeLog

    rng = np.random.default_rng(0)
    log = _DecodeLog()
    windows = [list(range(w, w + 30)) for w in range(0, 300, 30)]
    for _ in range(300):
        for window in rng.permutation(len(windows)):
            for group in rng.permutation(windows[window]):
                assert not log.again_soon(("part-0", int(group)))
    # a cache of 4 groups under the same windows, rows drawn at random in each, for 3 passes
    thrashing, cache, said = _DecodeLog(), OrderedDict[int, None](), []
    for _ in range(3):
        for window in rng.permutation(len(windows)):
            for group in rng.choice(windows[window], size=16 * 30):
                if int(group) in cache:
                    cache.move_to_end(int(group))
                    continue
                said.append(thrashing.again_soon(("part-0", int(group))))
                cache[int(group)] = None
                if len(cache) > 4:
                    cache.popitem(last=False)
    assert said.count(True) == 1


def test_the_decode_log_is_bounded_over_a_pass_of_many_groups() -> None:
    """It kept every group ever decoded: a pass over 10M row groups held 1.8 GB of it in
    each process. Now the last 65,536, and it still tells a cache that thrashes."""
    from zephon_torch.io.parquet import _DecodeLog

    log = _DecodeLog()
    limit = _DecodeLog._MAX_SEEN
    for group in range(limit + 5_000):
        assert not log.again_soon(("part-0", group))
    assert len(log._seen) == limit
    said = [log.again_soon(("part-1", group % 40)) for group in range(40 * 20)]
    assert said.count(True) == 1
    assert not log._seen  # nothing kept once it has said it


# -- big shards split into window blocks ----------------------------------------------------------


def _token_shards(
    folder: Path, shards: int, groups: int, per_group: int = 16, width: int = 64
) -> int:
    """`shards` Parquet files of `groups` row groups of `per_group` rows of `width` token ids
    (row i holds ids i, i+1, ... of its shard); returns one row group's `decoded_bytes`."""
    folder.mkdir(parents=True, exist_ok=True)
    for shard in range(shards):
        rows = [list(range(i, i + width)) for i in range(groups * per_group)]
        table = pa.table({"ids": pa.array(rows, type=pa.list_(pa.int32()))})
        pq.write_table(table, folder / f"part-{shard}.parquet", row_group_size=per_group)
    from zephon_torch.io.parquet import decoded_bytes

    return decoded_bytes(pq.ParquetFile(folder / "part-0.parquet").metadata.row_group(0))


def test_a_shard_above_the_block_size_is_split_into_runs_of_row_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from zephon_torch.io import parquet

    group = _token_shards(tmp_path / "big", shards=1, groups=10)
    unsplit = Dataset.from_path("d", tmp_path / "big")
    assert unsplit.shards[0].blocks == ()
    assert "blocks_digest" not in unsplit.fingerprint()
    monkeypatch.setattr(parquet, "WINDOW_BLOCK_BYTES", 3 * group + group // 2)
    split = Dataset.from_path("d", tmp_path / "big")
    assert split.shards[0].blocks == (48, 48, 48, 16)  # 3 groups of 16 rows, then the rest
    assert split.fingerprint()["blocks_digest"] != ""
    assert split.fingerprint()["rows_digest"] == unsplit.fingerprint()["rows_digest"]
    # a group above the size stands alone; a shard of one group is never split
    monkeypatch.setattr(parquet, "WINDOW_BLOCK_BYTES", group // 2)
    assert Dataset.from_path("d", tmp_path / "big").shards[0].blocks == (16,) * 10
    _token_shards(tmp_path / "one", shards=1, groups=1)
    assert Dataset.from_path("d", tmp_path / "one").shards[0].blocks == ()


@pytest.mark.parametrize("split", [True, False])
def test_windows_of_blocks_decode_each_row_group_once_a_pass_where_windows_of_shards_thrash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, split: bool
) -> None:
    """Two shards of 40 row groups of 128 rows, a window of 2 blocks (or shards) and a
    row-group cache of 32 groups: blocks of 4 groups keep the groups of the windows being read
    (chunks of up to 256 rows, two at a time, so at most two windows of 8 groups) in the
    cache, and each group is decoded once a pass; windows of two whole shards (80 groups)
    decode groups again and again."""
    from zephon_torch import Pipeline
    from zephon_torch.io import parquet
    from zephon_torch.io.parquet import GROUP_OVERHEAD, ParquetReader
    from zephon_torch.work import StaticMixtureWorkSource

    per_group, width = 128, 8
    group = _token_shards(tmp_path / "data", shards=2, groups=40, per_group=per_group, width=width)
    if split:
        monkeypatch.setattr(parquet, "WINDOW_BLOCK_BYTES", 4 * group + group // 2)
    decoded: list[tuple[str, int]] = []
    decode = ParquetReader._decode

    def counted(self: ParquetReader, path: str, opened: object, number: int) -> object:
        decoded.append((path, number))
        return decode(self, path, opened, number)  # type: ignore[arg-type]

    monkeypatch.setattr(ParquetReader, "_decode", counted)
    # a group's decoded ids and offsets, and its objects
    weight = per_group * width * 4 + (per_group + 1) * 8 + GROUP_OVERHEAD
    cache = {"parquet": {"row_group_cache_bytes": 32 * weight}}
    dataset = Dataset.from_path("d", tmp_path / "data", token_columns=["ids"], io_options=cache)
    assert [len(s.blocks) for s in dataset.shards] == ([10, 10] if split else [0, 0])
    source = StaticMixtureWorkSource([dataset], seed=5, exhaustion="stop", shuffle_window_shards=2)
    pipeline = Pipeline(source).pretokenized("ids").pack_flat(256).batch(2)
    firsts = []
    for batch in pipeline:
        ids = batch.input_ids.reshape(-1, width)[: batch.num_tokens // width]
        firsts += ids[:, 0].tolist()
    assert sorted(firsts) == sorted(list(range(40 * per_group)) * 2)  # every row once
    every_group = [
        (str(p), g) for p in sorted((tmp_path / "data").glob("*.parquet")) for g in range(40)
    ]
    if split:
        assert sorted(decoded) == every_group
    else:
        assert len(decoded) > 10 * len(every_group)


def test_a_row_group_is_weighed_by_its_decoded_token_arrays_plus_its_other_columns(
    tmp_path: Path,
) -> None:
    """A token column counts once, by its decoded arrays: counting its footer size as well
    made a window of token shards weigh twice what it holds."""
    from zephon_torch.io.parquet import GROUP_OVERHEAD

    table = pa.table(
        {
            "ids": pa.array([[i] * 100 for i in range(50)], pa.list_(pa.int32())),
            "text": [f"row {i} " * 20 for i in range(50)],
        }
    )
    pq.write_table(table, tmp_path / "part-0.parquet", row_group_size=50)
    column = pq.ParquetFile(tmp_path / "part-0.parquet").metadata.row_group(0).column(1)
    assert column.path_in_schema == "text"
    ids_bytes = 50 * 100 * 4 + 51 * 8 + GROUP_OVERHEAD  # values, offsets and objects
    for columns, expected in (
        (["ids"], ids_bytes),
        (["ids", "text"], ids_bytes + column.total_uncompressed_size),
    ):
        dataset = Dataset.from_path("d", tmp_path, columns=columns, token_columns=["ids"])
        dataset.read_rows(0, [7])
        groups = dataset._reader._groups  # type: ignore[attr-defined]
        assert groups._current().weight == expected


def test_decoded_bytes_count_dictionary_encoded_token_ids_at_their_width(tmp_path: Path) -> None:
    """Dictionary-encoded ids take a few bits each in the pages (2 bytes below 65,536) and 4
    as int32 arrays: window blocks sized by the pages held twice what they should and
    thrashed the cache."""
    from zephon_torch.io.parquet import decoded_bytes

    rng = np.random.default_rng(0)
    ids = rng.integers(0, 1000, size=(400, 500), dtype=np.int32)
    table = pa.table(
        {
            "ids": pa.array(list(ids), pa.list_(pa.int32())),
            "text": [f"document {i}" for i in range(400)],
        }
    )
    pq.write_table(table, tmp_path / "part-0.parquet", compression="none")
    group = pq.ParquetFile(tmp_path / "part-0.parquet").metadata.row_group(0)
    assert group.total_byte_size < 0.5 * ids.nbytes  # the pages fall short
    text = group.column(1).total_uncompressed_size
    assert decoded_bytes(group) == ids.nbytes + text


def test_a_pipeline_over_split_shards_resumes_exactly_at_every_step_and_refuses_old_states(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.helpers import assert_resumes_at_every_step
    from zephon_torch import Pipeline
    from zephon_torch.errors import ZephonError
    from zephon_torch.io import parquet
    from zephon_torch.work import StaticMixtureWorkSource

    group = _token_shards(tmp_path / "data", shards=3, groups=6, per_group=4, width=5)
    unsplit = Dataset.from_path("d", tmp_path / "data", token_columns=["ids"])
    monkeypatch.setattr(parquet, "WINDOW_BLOCK_BYTES", 2 * group)
    split = Dataset.from_path("d", tmp_path / "data", token_columns=["ids"])
    assert [s.blocks for s in split.shards] == [(8, 8, 8)] * 3

    def build(dataset: Dataset = split) -> Pipeline:
        source = StaticMixtureWorkSource(
            [dataset], seed=4, exhaustion="repeat", shuffle_window_shards=2
        )
        pipeline = Pipeline(source).options(canonical_replicas=2)
        return pipeline.pretokenized("ids").pack_flat(12, "best_fit").batch(2)

    assert assert_resumes_at_every_step(build, max_steps=40) == 40  # past a pass (72 rows)
    # a state of the same files read before the split names another order: refused
    old = build(unsplit)
    next(iter(old))
    with pytest.raises(ZephonError, match=r"(?s)does not match this pipeline.*blocks_digest"):
        build().load_state_dict(old.state_dict())


def test_empty_row_groups_join_a_block_and_never_make_one_of_their_own(tmp_path: Path) -> None:
    from zephon_torch.io.parquet import WINDOW_BLOCK_BYTES, group_sizes, window_blocks

    big = WINDOW_BLOCK_BYTES  # each non-empty group fills a block alone
    assert window_blocks([(0, 14), (100, big), (100, big), (0, 14)]) == (100, 100)
    assert window_blocks([(100, big), (0, 14), (100, big), (100, big), (0, 14)]) == (
        100,
        100,
        100,
    )
    # a writer's last, empty, write makes an empty row group
    path = tmp_path / "part-0.parquet"
    table = pa.table({"n": list(range(30))})
    with pq.ParquetWriter(path, table.schema) as writer:
        for start in (0, 10, 20):
            writer.write_table(table.slice(start, 10))
        writer.write_table(table.slice(30, 0))
    groups = group_sizes(pq.ParquetFile(path).metadata)
    assert [rows for rows, _ in groups] == [10, 10, 10, 0]
    sized = [(rows, big if rows else 14) for rows, _ in groups]
    assert window_blocks(sized) == (10, 10, 10)
