"""`hf://` datasets read offline from a pre-populated hub cache (`HF_HUB_OFFLINE=1`): plain data
files, dataset cards, the hub's auto-converted Parquet (`refs/convert/parquet`), revisions, and
caches holding part of a repository (filled by `snapshot_download` from the stand-in hub in
`tests/hub_server.py`). Online reads are in `test_hf_hub_online.py`."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.hf_repos import (
    cache_snapshot,
    download_patterns,
    open_hf,
    plain_repo,
    read_offline,
    read_online,
    read_tokens,
    run_offline,
    script_repo,
    token_file,
    write_split,
)
from tests.hub_server import Hub, serve
from tests.unit.io.test_io_formats_writers import write_mds
from zephon_torch.io import Dataset
from zephon_torch.io._hf_splits import check_complete, parse_hf_url, pinned_revision

pytest.importorskip("huggingface_hub")


def test_plain_data_files_of_a_split_are_read_from_the_offline_cache(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    snapshot = cache_snapshot(cache, "org/plain", "main", "a" * 40)
    write_split(snapshot / "data" / "train-00000-of-00002.parquet", "train", 3)
    write_split(snapshot / "data" / "train-00001-of-00002.parquet", "train", 2)
    write_split(snapshot / "data" / "test-00000-of-00001.parquet", "test", 4)
    (snapshot / "README.md").write_text("# card")
    result = read_offline(cache, "hf://org/plain/train", tmp_path)
    assert result["format"] == "parquet"
    assert [row["text"] for row in result["rows"]] == [
        "train 0",
        "train 1",
        "train 2",
        "train 0",
        "train 1",
    ]


def test_offline_a_split_not_there_names_the_splits_there_and_no_hub_advice(
    tmp_path: Path,
) -> None:
    """It named neither 'train' nor 'test', and passed on huggingface_hub's advice to pass
    `local_files_only=False`, no setting of ours (a fresh-user trial)."""
    cache = tmp_path / "hub"
    snapshot = cache_snapshot(cache, "org/plain", "main", "a" * 40)
    write_split(snapshot / "data" / "train-00000-of-00001.parquet", "train", 3)
    write_split(snapshot / "data" / "test-00000-of-00001.parquet", "test", 4)
    (snapshot / "README.md").write_text("# card")
    done = run_offline(cache, "hf://org/plain/validation", tmp_path)
    assert done.returncode != 0
    assert "main: no files of split 'validation'; its files' names read as splits " in (done.stderr)
    assert "['test', 'train']" in done.stderr
    assert "refs/convert/parquet: not in the hub cache (LocalEntryNotFoundError)" in done.stderr
    assert "local_files_only" not in done.stderr
    missing = run_offline(cache, "hf://org/nothere/train", tmp_path)
    assert "main: not in the hub cache" in missing.stderr
    assert "local_files_only" not in missing.stderr


def test_a_split_mixing_formats_is_refused_with_advice_an_hf_path_can_take(
    tmp_path: Path,
) -> None:
    """The refusal advised a glob, which no hf:// path is (a walkthrough's doubt)."""
    cache = tmp_path / "hub"
    snapshot = cache_snapshot(cache, "org/mixed", "main", "a" * 40)
    write_split(snapshot / "data" / "train-00000-of-00001.parquet", "train", 3)
    (snapshot / "data" / "train-00000-of-00001.jsonl").write_text('{"text": "x"}\n')
    (snapshot / "README.md").write_text("# card")
    done = run_offline(cache, "hf://org/mixed/train", tmp_path)
    assert done.returncode != 0
    assert "'hf://org/mixed/train' mixes formats (jsonl: 1 files" in done.stderr
    assert "a config of the dataset card (`configs:`, `data_files`)" in done.stderr
    assert "glob such as" not in done.stderr


def test_the_auto_converted_parquet_layout_is_read_from_the_offline_cache(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    main = cache_snapshot(cache, "org/conv", "main", "b" * 40)
    (main / "README.md").write_text("# a dataset with a loading script")
    (main / "conv.py").write_text("# builder")
    converted = cache_snapshot(cache, "org/conv", "refs/convert/parquet", "c" * 40)
    write_split(converted / "wiki" / "train" / "0000.parquet", "wiki-train", 3)
    write_split(converted / "wiki" / "partial-validation" / "0000.parquet", "wiki-val", 2)
    write_split(converted / "other" / "train" / "0000.parquet", "other", 1)
    train = read_offline(cache, "hf://org/conv/wiki/train", tmp_path)
    assert [row["text"] for row in train["rows"]] == [f"wiki-train {i}" for i in range(3)]
    assert "partial" not in train["stderr"]
    validation = read_offline(cache, "hf://org/conv/wiki/validation", tmp_path)
    assert [row["text"] for row in validation["rows"]] == ["wiki-val 0", "wiki-val 1"]
    assert "reads the hub's auto-converted Parquet `partial-validation`" in validation["stderr"]


def test_a_split_the_dataset_card_defines_is_read_from_its_data_files(tmp_path: Path) -> None:
    """Files named by crawl (FineWeb style), the split given by the card's `configs:`: nothing
    on main matched by name, so the hub's partial conversion (a prefix) was read, silently."""
    cache = tmp_path / "hub"
    main = cache_snapshot(cache, "org/fw", "main", "a" * 40)
    (main / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n"
        "    path: data/*/*\n- config_name: sample\n  data_files: sample/**/*.parquet\n"
        "---\n# a card\n"
    )
    write_split(main / "data" / "CC-1" / "000_00000.parquet", "crawl-1", 3)
    write_split(main / "data" / "CC-2" / "000_00000.parquet", "crawl-2", 2)
    write_split(main / "sample" / "a" / "s.parquet", "sample", 1)
    converted = cache_snapshot(cache, "org/fw", "refs/convert/parquet", "c" * 40)
    write_split(converted / "default" / "partial-train" / "0000.parquet", "partial", 1)
    train = read_offline(cache, "hf://org/fw/train", tmp_path)
    expected = ["crawl-1 0", "crawl-1 1", "crawl-1 2", "crawl-2 0", "crawl-2 1"]
    assert [row["text"] for row in train["rows"]] == expected
    assert read_offline(cache, "hf://org/fw/default/train", tmp_path)["rows"] == train["rows"]
    sample = read_offline(cache, "hf://org/fw/sample/train", tmp_path)
    assert [row["text"] for row in sample["rows"]] == ["sample 0"]
    missing = run_offline(cache, "hf://org/fw/nope/train", tmp_path)
    assert "the dataset card has no config 'nope'" in missing.stderr


def test_a_card_config_s_data_dir_holds_its_splits(tmp_path: Path) -> None:
    """A config with a `data_dir` and no `data_files` finds its splits by name under the
    folder; with `data_files`, they are relative to it. Both fell back to the converted
    Parquet's partial prefix."""
    cache = tmp_path / "hub"
    main = cache_snapshot(cache, "org/langs", "main", "a" * 40)
    (main / "README.md").write_text(
        "---\nconfigs:\n- config_name: en\n  data_dir: english\n  default: true\n"
        "- config_name: fr\n  data_dir: french/\n  data_files:\n  - split: train\n"
        "    path: 'part-*.parquet'\n---\n# a card\n"
    )
    write_split(main / "english" / "train-00000-of-00001.parquet", "en-train", 2)
    write_split(main / "english" / "test-00000-of-00001.parquet", "en-test", 1)
    write_split(main / "french" / "part-0.parquet", "fr", 3)
    write_split(main / "train-00000-of-00001.parquet", "root", 1)  # in no config
    converted = cache_snapshot(cache, "org/langs", "refs/convert/parquet", "c" * 40)
    write_split(converted / "en" / "partial-train" / "0000.parquet", "partial", 1)
    train = read_offline(cache, "hf://org/langs/train", tmp_path)
    assert [row["text"] for row in train["rows"]] == ["en-train 0", "en-train 1"]
    assert "partial" not in train["stderr"]
    test = read_offline(cache, "hf://org/langs/en/test", tmp_path)
    assert [row["text"] for row in test["rows"]] == ["en-test 0"]
    french = read_offline(cache, "hf://org/langs/fr/train", tmp_path)
    assert [row["text"] for row in french["rows"]] == ["fr 0", "fr 1", "fr 2"]


def test_the_commit_read_is_in_the_fingerprint_and_a_revision_can_be_pinned(
    tmp_path: Path,
) -> None:
    """A branch moved to a commit with the same file names and row counts gave the same
    fingerprint, so a resume went on over other data unnoticed; no revision could be named."""
    cache = tmp_path / "hub"
    old = cache_snapshot(cache, "org/moved", "main", "a" * 40)
    write_split(old / "data" / "train-00000-of-00001.parquet", "old", 3)
    new = cache_snapshot(cache, "org/moved", "main", "b" * 40)  # main points here now
    write_split(new / "data" / "train-00000-of-00001.parquet", "new", 3)
    latest = read_offline(cache, "hf://org/moved/train", tmp_path)
    pinned = read_offline(cache, f"hf://org/moved@{'a' * 40}/train", tmp_path)
    assert [row["text"] for row in latest["rows"]] == ["new 0", "new 1", "new 2"]
    assert [row["text"] for row in pinned["rows"]] == ["old 0", "old 1", "old 2"]
    assert latest["fingerprint"]["revision"] == "b" * 40
    assert pinned["fingerprint"]["revision"] == "a" * 40
    assert parse_hf_url(f"hf://org/moved@{'a' * 40}/c/train") == ("org/moved", "c", "train")
    assert pinned_revision(f"hf://org/moved@{'a' * 40}/train") == "a" * 40
    assert pinned_revision("hf://org/moved/train") is None


def test_offline_a_revision_the_cache_lacks_is_named_with_what_it_holds(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    plain_repo(cache_snapshot(cache, "org/plain", "main", "a" * 40))
    cache_snapshot(cache, "org/plain", "refs/convert/parquet", "b" * 40)
    (cache / "datasets--org--plain" / "snapshots" / ("c" * 40)).mkdir()
    (cache / "datasets--org--plain" / "refs" / "dev").write_text("d" * 40)  # files never came
    lacking = run_offline(cache, "hf://org/plain@v9/train", tmp_path)
    absent = run_offline(cache, "hf://org/other@v9/train", tmp_path)
    assert (
        "ConfigError: 'hf://org/plain@v9/train': the hub cache holds no revision 'v9' of "
        "org/plain: it holds dev (commit dddddddddddd, whose files it lacks), main (commit "
        f"aaaaaaaaaaaa), refs/convert/parquet (commit bbbbbbbbbbbb), {'c' * 40}"
    ) in lacking.stderr
    assert f"of org/other: it holds nothing of it (in {cache})" in absent.stderr


def test_a_hub_cache_holding_part_of_a_split_s_numbered_shards_is_an_error(
    tmp_path: Path,
) -> None:
    """snapshot_download offline returns the snapshot folder whatever it holds: a split
    downloaded in part was read as the whole, silently."""
    cache = tmp_path / "hub"
    snapshot = cache_snapshot(cache, "org/plain", "main", "a" * 40)
    write_split(snapshot / "data" / "train-00000-of-00003.parquet", "train", 3)
    write_split(snapshot / "data" / "train-00002-of-00003.parquet", "train", 2)
    done = run_offline(cache, "hf://org/plain/train", tmp_path)
    assert done.returncode != 0
    assert "the hub cache holds 2 of the 3 shards of 'hf://org/plain/train'" in done.stderr
    assert "data/train-00001-of-00003*.parquet" in done.stderr
    # shards named with a suffix of their own each (datasets' push_to_hub) group together
    check_complete("hf://o/n/train", [f"d/train-0000{i}-of-00002-{i}f3a.parquet" for i in (0, 1)])


def test_offline_a_split_downloaded_alone_reads_and_a_missing_card_is_named(
    tmp_path: Path,
) -> None:
    """huggingface_hub calls a snapshot incomplete when a listed file matching the patterns
    asked for is missing: `*train*` matched another split's `train_sft-*` and a cached split
    was 'not found'. Without the card, the split was chosen by file names, not by the card's
    configs: other files than online, silently."""
    repo = tmp_path / "repo"
    write_split(repo / "data" / "train-00000-of-00001.parquet", "train", 3)
    write_split(repo / "data" / "train_sft-00000-of-00001.parquet", "sft", 2)
    write_split(repo / "data" / "test-00000-of-00001.parquet", "test", 2)
    (repo / "README.md").write_text("# card")
    hub = Hub()
    hub.add("org/r", "main", repo)
    with serve(hub) as endpoint:
        download_patterns(endpoint, tmp_path / "split", "org/r", ["data/train-*", "README.md"])
        download_patterns(endpoint, tmp_path / "cardless", "org/r", ["data/*"])
    result = read_offline(tmp_path / "split", "hf://org/r/train", tmp_path)
    assert [row["text"] for row in result["rows"]] == ["train 0", "train 1", "train 2"]
    done = run_offline(tmp_path / "cardless", "hf://org/r/train", tmp_path)
    assert done.returncode != 0
    assert "ConfigError: 'hf://org/r/train': the hub cache holds 'org/r' without its " in (
        done.stderr
    )


def test_the_converted_parquet_s_only_config_is_read_and_a_missing_one_names_what_there_is(
    tmp_path: Path,
) -> None:
    """With no config named, the converted layout was looked up under `default/` only: a
    dataset whose one config has another name was "not found". Errors now list the configs
    or splits there are, online and offline; a converted split cached in part is named."""
    script = script_repo(tmp_path / "script")
    one = tmp_path / "one"
    write_split(one / "en" / "train" / "0000.parquet", "en-train-0", 2)
    write_split(one / "en" / "train" / "0001.parquet", "en-train-1", 1)
    write_split(one / "en" / "partial-validation" / "0000.parquet", "en-val", 1)
    two = tmp_path / "two"
    write_split(two / "en" / "train" / "0000.parquet", "en", 1)
    write_split(two / "fr" / "train" / "0000.parquet", "fr", 1)
    hub = Hub()
    for name, converted in (("org/one", one), ("org/two", two)):
        hub.add(name, "main", script)
        hub.add(name, "refs/convert/parquet", converted)
    expected = ["en-train-0 0", "en-train-0 1", "en-train-1 0"]
    with serve(hub) as endpoint:
        train = read_online("hf://org/one/train", endpoint, tmp_path)
        assert [row["text"] for row in train["rows"]] == expected
        test = read_online("hf://org/one/test", endpoint, tmp_path, fails=True)["stderr"]
        assert "no split 'test' in config 'en' (splits: ['train', 'validation'])" in test
        both = read_online("hf://org/two/train", endpoint, tmp_path, fails=True)["stderr"]
        assert "configs ['en', 'fr']: name one, hf://org/name/CONFIG/split" in both
        other = read_online("hf://org/two/de/train", endpoint, tmp_path, fails=True)["stderr"]
        assert "no config 'de' (configs: ['en', 'fr'])" in other
        convert = "refs/convert/parquet"
        download_patterns(endpoint, tmp_path / "whole", "org/one", ["en/train/*"], convert)
        download_patterns(
            endpoint, tmp_path / "part", "org/one", ["en/train/0000.parquet"], convert
        )
    offline = read_offline(tmp_path / "whole", "hf://org/one/train", tmp_path)
    assert [row["text"] for row in offline["rows"]] == expected
    done = run_offline(tmp_path / "part", "hf://org/one/train", tmp_path)
    assert done.returncode != 0
    assert "the hub cache holds only part of 'hf://org/one/train'" in done.stderr
    assert "en/train/0001.parquet" in done.stderr


def test_offline_a_split_cached_in_part_whose_files_are_not_numbered_is_named(
    tmp_path: Path,
) -> None:
    """Only `-00001-of-00004` numbers told a cache holding part of an uploaded split: one of
    files named otherwise (a card's `data/*/*`, a `train/` folder) read the part as the whole,
    the rest of the split lost without a word. The listing huggingface_hub keeps of the whole
    commit now says what the split holds."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n"
        "    path: data/*/*\n---\n"
    )
    write_split(repo / "data" / "CC-1" / "000_00000.parquet", "crawl-1", 3)
    write_split(repo / "data" / "CC-2" / "000_00000.parquet", "crawl-2", 2)
    plain = tmp_path / "plain"
    write_split(plain / "train" / "part-a.parquet", "a", 2)
    (plain / "README.md").write_text("# card")
    write_split(plain / "train" / "part-b.parquet", "b", 2)
    hub = Hub()
    hub.add("org/fw", "main", repo)
    hub.add("org/plain", "main", plain)
    with serve(hub) as endpoint:
        download_patterns(endpoint, tmp_path / "fw", "org/fw", ["README.md", "data/CC-1/*"])
        download_patterns(
            endpoint, tmp_path / "plain-part", "org/plain", ["README.md", "train/part-a*"]
        )
        download_patterns(endpoint, tmp_path / "plain-whole", "org/plain", ["README.md", "train/*"])
    for cache, url, missing in (
        ("fw", "hf://org/fw/train", "data/CC-2/000_00000.parquet"),
        ("plain-part", "hf://org/plain/train", "train/part-b.parquet"),
    ):
        done = run_offline(tmp_path / cache, url, tmp_path)
        assert done.returncode != 0
        assert f"the hub cache holds only part of {url!r}: 1 of its 2 files are missing " in (
            done.stderr
        )
        assert f"({missing})" in done.stderr
    whole = read_offline(tmp_path / "plain-whole", "hf://org/plain/train", tmp_path)
    assert [row["text"] for row in whole["rows"]] == ["a 0", "a 1", "b 0", "b 1"]


def test_a_pinned_commit_of_the_converted_parquet_reads_what_the_unpinned_url_read(
    tmp_path: Path,
) -> None:
    """Pinned, as the fingerprint records it to resume on, a commit of the converted Parquet
    was read by the rules of uploaded files: every config's `train/` folder, mixed (and,
    offline, without the check of a split cached in part)."""
    script = script_repo(tmp_path / "script")
    converted = tmp_path / "converted"
    write_split(converted / "default" / "train" / "0000.parquet", "default", 2)
    write_split(converted / "other" / "train" / "0000.parquet", "other", 2)
    again = tmp_path / "again"  # converted anew later: the pinned commit is an older one
    write_split(again / "default" / "train" / "0000.parquet", "again", 1)
    hub = Hub()
    hub.add("org/conv", "main", script)
    hub.add("org/conv", "refs/convert/parquet", converted)
    first = Hub.sha("org/conv", "refs/convert/parquet", converted)
    uploaded = Hub.sha("org/conv", "main", script)
    expected = ["default 0", "default 1"]
    with serve(hub) as endpoint:
        for url in (
            "hf://org/conv/train",
            f"hf://org/conv@{first}/train",
            "hf://org/conv@refs%2Fconvert%2Fparquet/train",
        ):
            assert [row["text"] for row in read_online(url, endpoint, tmp_path)["rows"]] == (
                expected
            ), url
        hub.add("org/conv", "refs/convert/parquet", again)
        pinned = read_online(f"hf://org/conv@{first}/train", endpoint, tmp_path)
        assert [row["text"] for row in pinned["rows"]] == expected
        # a commit of main is read as uploaded files only: no converted rules on it
        err = read_online(f"hf://org/conv@{uploaded}/train", endpoint, tmp_path, fails=True)
        assert (
            f"'hf://org/conv@{uploaded}/train': {uploaded}: no files of split 'train'"
            in (err["stderr"])
        )
    cache = tmp_path / "cache"
    offline = cache_snapshot(cache, "org/conv", "refs/convert/parquet", "c" * 40)
    write_split(offline / "default" / "train" / "0000.parquet", "default", 2)
    write_split(offline / "other" / "train" / "0000.parquet", "other", 2)
    for url in ("hf://org/conv/train", f"hf://org/conv@{'c' * 40}/train"):
        assert [row["text"] for row in read_offline(cache, url, tmp_path)["rows"]] == expected
    # an older conversion, which no cached ref names: offline, its layout cannot be told, and
    # the two readings differ; with the config named they agree
    older = cache / "datasets--org--conv" / "snapshots" / ("e" * 40)
    write_split(older / "default" / "train" / "0000.parquet", "default", 2)
    write_split(older / "other" / "train" / "0000.parquet", "other", 2)
    done = run_offline(cache, f"hf://org/conv@{'e' * 40}/train", tmp_path)
    assert done.returncode != 0
    assert "may be of the hub's auto-converted Parquet or of uploaded files, and the two " in (
        done.stderr
    )
    named = read_offline(cache, f"hf://org/conv@{'e' * 40}/default/train", tmp_path)
    assert [row["text"] for row in named["rows"]] == expected


def test_a_revision_named_with_a_slash_is_pinned_with_2f(tmp_path: Path) -> None:
    """`@release/v1` cannot be told from a config folder in the URL; `%2F` stands for the `/`
    (as on the hub's file system), and the error of the first form says so."""
    cache = tmp_path / "hub"
    write_split(cache_snapshot(cache, "org/p", "release/v1", "d" * 40) / "train.parquet", "v1", 2)
    write_split(cache_snapshot(cache, "org/p", "main", "a" * 40) / "train.parquet", "main", 1)
    pinned = read_offline(cache, "hf://org/p@release%2Fv1/train", tmp_path)
    assert [row["text"] for row in pinned["rows"]] == ["v1 0", "v1 1"]
    assert pinned_revision("hf://org/p@release%2Fv1/train") == "release/v1"
    done = run_offline(cache, "hf://org/p@release/v1/train", tmp_path)
    assert done.returncode != 0
    assert "holds no revision 'release' of org/p: it holds main (commit aaaaaaaaaaaa), " in (
        done.stderr
    )
    assert "is written %2F in the URL: @release%2Fv1" in done.stderr
    missing = run_offline(cache, "hf://org/p/en/train", tmp_path)
    assert "main: no config folder 'en'" in missing.stderr


@pytest.mark.parametrize("layout", ["by name", "card"])
def test_a_split_of_1d_token_files_without_their_offsets_reads_as_the_local_files(
    tmp_path: Path, layout: str
) -> None:
    """A split whose files are 1-D `.npy` token files and not their offsets files (`train.npy`
    beside `train.offsets.npy`, or a card's `data/?.npy`) was refused online for lacking the
    offsets (DataError), where the hub cache and a local path read the offsets beside them."""
    repo = tmp_path / "repo"
    if layout == "by name":
        token_file(repo / "train.npy", [[1, 2, 3], [4], [5, 6]])
        token_file(repo / "test.npy", [[9]])
        (repo / "README.md").write_text("# card")
        local = repo / "train.npy"
    else:
        token_file(repo / "data" / "a.npy", [[1, 2, 3], [4], [5, 6]])
        token_file(repo / "data" / "b.npy", [[7, 8], [9]])
        (repo / "README.md").write_text(
            "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: train\n"
            "    path: data/?.npy\n---\n"
        )
        local = repo / "data" / "?.npy"
    dataset = Dataset.from_path("hf", str(local), index_cache_dir=str(tmp_path / "index"))
    fingerprint = dataset.fingerprint()
    ids = [
        ids.tolist()
        for n, shard in enumerate(dataset.shards)
        for ids in dataset.read_tokens(n, range(shard.num_rows), "input_ids") or []
    ]
    hub = Hub()
    hub.add("org/tokens", "main", repo)
    with serve(hub) as endpoint:
        online = read_tokens("hf://org/tokens/train", tmp_path, HF_ENDPOINT=endpoint)
    cache = tmp_path / "cache"
    shutil.copytree(repo, cache_snapshot(cache, "org/tokens", "main", "a" * 40), dirs_exist_ok=True)
    offline = read_tokens(
        "hf://org/tokens/train", tmp_path, HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1"
    )
    assert online == offline == {"ids": ids, "fingerprint": fingerprint}


def test_offline_a_split_cached_without_an_offsets_file_is_named_as_cached_in_part(
    tmp_path: Path,
) -> None:
    """A split of 1-D `.npy` token files downloaded without an `.offsets.npy` beside one
    (`hf download --include train.npy`) was a DataError of the token reader naming the
    offsets file, where any other file of the split missing from the hub cache is a
    ConfigError saying the cache holds only part of the split, to be downloaded. The offsets
    file of a 2-D token file, which has none, is not asked for."""
    repo = tmp_path / "repo"
    token_file(repo / "train.npy", [[1, 2, 3], [4], [5, 6]])
    token_file(repo / "test.npy", [[9]])
    (repo / "README.md").write_text("# card")
    flat = tmp_path / "flat-repo"
    flat.mkdir()
    np.save(flat / "train.npy", np.arange(6, dtype=np.int32).reshape(3, 2))
    (flat / "README.md").write_text("# card")
    hub = Hub()
    hub.add("org/tokens", "main", repo)
    hub.add("org/flat", "main", flat)
    with serve(hub) as endpoint:
        download_patterns(endpoint, tmp_path / "part", "org/tokens", ["README.md", "train.npy"])
        download_patterns(endpoint, tmp_path / "whole", "org/tokens", ["README.md", "train.*"])
        download_patterns(endpoint, tmp_path / "flat", "org/flat", ["README.md", "train.npy"])
    url = "hf://org/tokens/train"
    done = run_offline(tmp_path / "part", url, tmp_path)
    assert done.returncode != 0
    assert "ConfigError: the hub cache holds only part of 'hf://org/tokens/train': 1 of its " in (
        done.stderr
    )
    assert "are missing (train.offsets.npy); download the split" in done.stderr
    whole = read_tokens(url, tmp_path, HF_HUB_CACHE=str(tmp_path / "whole"), HF_HUB_OFFLINE="1")
    assert whole["ids"] == [[1, 2, 3], [4], [5, 6]]
    rows = read_tokens(
        "hf://org/flat/train", tmp_path, HF_HUB_CACHE=str(tmp_path / "flat"), HF_HUB_OFFLINE="1"
    )
    assert rows["ids"] == [[0, 1], [2, 3], [4, 5]]


def test_a_split_holding_an_mds_dataset_is_refused_not_read_as_json_lines(tmp_path: Path) -> None:
    """A split folder holding an MDS dataset (`train/index.json` and its `.mds` shards) was
    read as JSON Lines online and offline, one row of index, its shards left out (no data file
    ending), where the local folder reads its rows and a local glob of its files is refused;
    with `format="mds"` it read offline and failed online for a shard 'missing'."""
    repo = tmp_path / "repo"
    write_mds(repo / "train", [{"text": f"row {i}"} for i in range(4)], {"text": "str"})
    (repo / "README.md").write_text("# card")
    local = Dataset.from_path("hf", str(repo / "train"), index_cache_dir=str(tmp_path / "i"))
    assert local.format == "mds" and local.num_rows == 4
    hub = Hub()
    hub.add("org/mds", "main", repo)
    cache = tmp_path / "cache"
    shutil.copytree(repo, cache_snapshot(cache, "org/mds", "main", "a" * 40), dirs_exist_ok=True)
    offline = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    with serve(hub) as endpoint:
        for env in ({"HF_ENDPOINT": endpoint}, offline):
            detected = open_hf("hf://org/mds/train", None, tmp_path, **env)
            assert (
                "ConfigError: 'hf://org/mds/train': 'train/index.json' and the 1 MDS or LitData "
                "shard files beside it, e.g. 'train/shard.00000.mds', are an MDS or LitData "
                "dataset, which hf:// does not read"
            ) in detected, detected
            assert "--include 'train/*'" in detected
            named = open_hf("hf://org/mds/train", "mds", tmp_path, **env)
            assert "ConfigError: 'hf://org/mds/train': `format` is 'mds', but hf://" in named


def test_a_config_folder_the_repo_lacks_is_named_with_the_folders_there(tmp_path: Path) -> None:
    """`hf://org/name/de/train` on a repo without a card whose configs are its folders said
    "no config folder 'de'" alone, online and offline: which names a URL takes went unsaid."""
    repo = tmp_path / "repo"
    for config in ("en", "fr"):
        write_split(repo / config / "train-00000-of-00001.parquet", config, 2)
    write_split(repo / "_extra" / "train.parquet", "hidden", 1)
    (repo / "README.md").write_text("# card")
    hub = Hub()
    hub.add("org/langs", "main", repo)
    cache = tmp_path / "cache"
    shutil.copytree(repo, cache_snapshot(cache, "org/langs", "main", "a" * 40), dirs_exist_ok=True)
    offline = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    with serve(hub) as endpoint:
        for env in ({"HF_ENDPOINT": endpoint}, offline):
            said = open_hf("hf://org/langs/de/train", None, tmp_path, **env)
            assert (
                "main: no config folder 'de' (its folders with data files: ['en', 'fr'])" in said
            ), said
