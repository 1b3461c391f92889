"""Which files of a hub repository make up an `hf://` split (`_hf_splits`): pure functions of
a file list and a dataset card, no hub needed. Reading through the hub and its cache is in
`tests/integration/test_hf_hub.py`."""

from __future__ import annotations

import glob
import os
import re
from pathlib import Path

import pytest

from zephon_torch.errors import ConfigError
from zephon_torch.io._hf_card import card_configs
from zephon_torch.io._hf_splits import find_split, parse_hf_url, split_files


def test_hf_urls_and_split_files_are_parsed_without_the_hub() -> None:
    assert parse_hf_url("hf://Salesforce/wikitext/wikitext-2-raw-v1/train") == (
        "Salesforce/wikitext",
        "wikitext-2-raw-v1",
        "train",
    )
    assert parse_hf_url("hf://org/name/test") == ("org/name", None, "test")
    # the hub file system's form was read as repo 'datasets/org', config 'name' (not found)
    with pytest.raises(ConfigError, match=r"hub file system's form .*leave out 'datasets/'"):
        parse_hf_url("hf://datasets/org/name/train")
    files = ["data/train-0.parquet", "data/training.txt", "test.jsonl", "c/train/x.parquet"]
    assert split_files(files, None, "train") == ["c/train/x.parquet", "data/train-0.parquet"]
    assert split_files(files, "c", "train") == ["c/train/x.parquet"]
    # other splits whose names begin with the one asked for are not it (ultrachat, mnli, ...)
    others = [
        "data/train_sft-00000-of-00001.parquet",
        "data/train_unlabeled-00000-of-00001.parquet",
        "clean/train.100-00000-of-00001.parquet",
        "data/train.clean.100-00000-of-00001.parquet",  # a dot, then a letter: not an ending
        "data/train.other.jsonl",
        "mnli/validation_matched-00000-of-00001.parquet",
    ]
    mine = [
        "data/train-00000-of-00001.parquet",
        "train.jsonl.gz",
        "x/train_0.parquet",
        "T/train.JSONL",
    ]
    assert split_files(others + mine, None, "train") == sorted(mine)
    assert split_files(others, None, "validation") == []
    assert split_files(others, None, "train_sft") == [others[0]]
    assert split_files(others, None, "train.clean.100") == [others[3]]
    # a card's config: data_dir alone (splits by name under it) or with data_files under it
    layout = ["en/train-0.parquet", "en/test.parquet", "train.parquet", "fr/a/x.parquet"]
    configs = [
        {"config_name": "en", "data_dir": "en"},
        {"config_name": "fr", "data_dir": "fr", "data_files": "a/*"},
    ]
    assert split_files(layout, "en", "train", configs) == ["en/train-0.parquet"]
    assert split_files(layout, "fr", "train", configs) == ["fr/a/x.parquet"]
    assert split_files(layout, "fr", "test", configs) == []
    assert split_files(layout, None, "train", [{"config_name": "default"}]) == [
        "en/train-0.parquet",
        "train.parquet",
    ]
    # character classes, as the hub's fsspec glob reads them (they matched nothing)
    shards = [f"data/train-{i:05d}-of-00010.parquet" for i in range(10)]
    ranged = [{"config_name": "default", "data_files": "data/train-0000[0-4]-*"}]
    assert split_files(shards, None, "train", ranged) == shards[:5]
    other = [{"config_name": "default", "data_files": "data/train-0000[!0-7]-*"}]
    assert split_files(shards, None, "train", other) == shards[8:]


def test_a_split_the_card_does_not_have_is_named_with_the_splits_it_has() -> None:
    configs = [
        {"config_name": "default", "data_files": {"train": "d/train*", "test": "d/test*"}},
        {"config_name": "chat", "data_files": [{"split": "sft", "path": "c/*"}]},
    ]
    files = ["d/train-0.parquet", "d/test-0.parquet", "c/x.parquet"]
    assert find_split(files, None, "train", configs) == (
        ["d/train-0.parquet"],
        "no files of split 'train'",
    )
    found, why = find_split(files, None, "validation", configs)
    assert found == []
    assert why == (
        "no files of split 'validation'; the card's config 'default' has splits ['test', 'train']"
    )
    assert find_split(files, "chat", "train", configs)[1].endswith(
        "config 'chat' has splits ['sft']"
    )


def test_a_split_of_no_files_is_named_with_the_splits_the_file_names_read_as() -> None:
    """Without a card, "no files of split 'test'" named none of the splits there (a fresh-user
    trial); a config folder's files are listed for that config alone."""
    files = [
        "data/train-00000-of-00002.jsonl",
        "data/train-00001-of-00002.jsonl",
        "data/validation-00000-of-00001.jsonl",
        "README.md",
        "en/test_0.parquet",
    ]
    found, why = find_split(files, None, "test2", ())
    assert found == []
    named = "['test', 'train', 'validation']"
    assert why == (
        f"no files of split 'test2'; its files' names read as splits {named}; its folders' "
        "names read as splits ['data', 'en']"
    )
    assert find_split(files, "en", "train", ())[1] == (
        "no files of split 'train'; its files' names read as splits ['test']"
    )
    assert find_split(files, None, "train", ())[1] == "no files of split 'train'"  # found


def test_a_split_of_no_files_is_named_with_the_splits_the_folder_names_read_as() -> None:
    """Files in split folders (`data/train/0000.jsonl`) had their names listed as the splits
    there ('0000', '0001'), the folders' splits 'train' and 'test' left unsaid."""
    files = ["data/train/0000.jsonl", "data/train/0001.jsonl", "data/test/0000.jsonl"]
    assert find_split(files, None, "validation", ())[1] == (
        "no files of split 'validation'; its files' names read as splits ['0000', '0001']; "
        "its folders' names read as splits ['data', 'test', 'train']"
    )
    assert find_split(files, None, "test", ())[0] == ["data/test/0000.jsonl"]
    assert find_split(["en/train/a.jsonl", "en/_x/b.jsonl"], "en", "test", ())[1] == (
        "no files of split 'test'; its files' names read as splits ['a']; its folders' names "
        "read as splits ['train']"
    )


@pytest.mark.parametrize(
    ("header", "named"),
    [
        ("configs:\n- config_name: default\n  data_files:\n  - split: train\n    path: 5\n", "5"),
        ("configs:\n- config_name: default\n  data_files:\n    train: 7\n", "7"),
        ("configs:\n- config_name: default\n  data_files: [{split: 3, path: a/*}]\n", "3"),
        ("configs:\n- config_name: default\n  data_files: 'data/[z-a]*'\n", "'data/[z-a]*'"),
        ("configs: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deep"),
        ("configs: [a, b]\n", "['a', 'b']"),
        ("configs:\n- config_name: [a]\n  data_files: data/*\n", "['a']"),
        ("configs:\n- config_name: x\n  default: 'true'\n  data_files: data/*\n", "'true'"),
        ("configs:\n- config_name: x\n  data_dir: 4\n", "4"),
    ],
)
def test_a_card_whose_configs_are_of_other_types_is_a_config_error_naming_it(
    header: str, named: str
) -> None:
    """A path or split that was a number raised TypeError ('int' object is not iterable), a
    reversed character range re.error, a header nested too deep RecursionError; a config that
    was not a mapping was skipped, and `default: 'true'` was not the default."""
    where = "hf://datasets/org/ds@main/README.md"
    with pytest.raises(ConfigError, match=re.escape(where)) as raised:
        card_configs(f"---\n{header}---\n# card", where=where)
    assert named in str(raised.value)


@pytest.mark.parametrize(
    "pattern", ["data/**/*.jsonl", "data/*", "**", "data/.*", "data/.extra/*", "./data/**"]
)
def test_a_card_glob_leaves_out_hidden_files_as_a_local_glob_does(
    tmp_path: Path, pattern: str
) -> None:
    """A card's `data/**/*.jsonl` took the copies in `data/.ipynb_checkpoints/` and
    `data/.hidden.jsonl` (rows read twice, or rows of no split), which a local glob of the same
    files, and the hub, leave out; a glob naming a hidden part takes it, as both do."""
    files = [
        "data/a.jsonl",
        "data/_b.jsonl",
        "data/sub/c.jsonl",
        "data/.hidden.jsonl",
        "data/.ipynb_checkpoints/a-checkpoint.jsonl",
        "data/.extra/d.jsonl",
        ".cache/e.jsonl",
    ]
    for file in files:
        (tmp_path / file).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / file).write_text('{"text": "x"}\n')
    local = sorted(
        os.path.relpath(path, tmp_path)
        for path in glob.glob(str(tmp_path / pattern), recursive=True)
        if os.path.isfile(path)
    )
    card = [{"config_name": "default", "data_files": pattern}]
    assert split_files(files, None, "train", card) == local


@pytest.mark.parametrize(
    "data_files",
    ["data/**.parquet", "{train: 'train**'}", "[{split: train, path: ['a/*', 'x**y/*.jsonl']}]"],
)
def test_a_card_glob_with_double_star_within_a_name_is_refused_as_on_the_hub(
    tmp_path: Path, data_files: str
) -> None:
    """A card's `data/**.parquet` took the files of every folder under data/, where a local
    (and a remote) glob of the same pattern reads `**` within a name as `*` (data/ itself), and
    the hub, whose fsspec glob refuses such a `**`, does not load the card at all. It is a
    ConfigError naming the glob and the two patterns the card may have meant."""
    files = ["data/a.parquet", "data/sub/b.parquet", "train-0.jsonl", "x/train/c.jsonl"]
    for file in files:
        (tmp_path / file).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / file).write_text("")
    local = glob.glob(str(tmp_path / "data/**.parquet"), recursive=True)
    assert [os.path.relpath(path, tmp_path) for path in local] == ["data/a.parquet"]
    where = "hf://datasets/org/ds@main/README.md"
    header = f"configs:\n- config_name: default\n  data_files: {data_files}\n"
    with pytest.raises(ConfigError, match=re.escape(where)) as raised:
        card_configs(f"---\n{header}---\n# card", where=where)
    message = str(raised.value)
    assert "'**' can only be a whole folder name" in message
    assert "'data/**/*.parquet'" in message and "'data/*.parquet'" in message
    # `**` standing alone as a folder name (or the whole glob) is a pattern, as on the hub
    for fine in ["data/**/*.parquet", "data/**", "**", "**/train/*"]:
        card_configs(f"---\nconfigs:\n- data_files: '{fine}'\n---\n", where=where)


@pytest.mark.parametrize(
    "card",
    [
        "\n---\n{header}---\n# card\n",  # a card written from a triple-quoted string
        "  \r\n---\r\n{header}---   \r\n# card",
        "---\n{header}---",
    ],
)
def test_a_card_s_header_is_found_as_huggingface_hub_finds_it(card: str) -> None:
    """A card opening with a blank line had its `configs:` left unread, where
    huggingface_hub's card parser (which the hub's loaders read cards with) reads them: its
    splits were taken by file names, the files of another folder than the card's, silently."""
    from huggingface_hub import DatasetCard

    header = "configs:\n- config_name: default\n  data_files:\n    train: data/clean/*\n"
    text = card.format(header=header.replace("\n", "\r\n" if "\r\n" in card else "\n"))
    configs = card_configs(text, where="README.md")
    assert configs == DatasetCard(text).data.to_dict()["configs"]
    files = ["data/clean/part-0.parquet", "data/raw/train-00000-of-00001.parquet"]
    assert split_files(files, None, "train", configs) == ["data/clean/part-0.parquet"]
