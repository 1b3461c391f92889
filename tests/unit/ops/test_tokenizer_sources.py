"""A tokenizer can be a tokenizers object, a transformers fast tokenizer, a local directory or
file, or a hub id served from the local hub cache; all give the same tokens."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

from tests.helpers import keys, small_pipeline
from zephon_torch.errors import ConfigError
from zephon_torch.ops._tokenizer import resolve_tokenizer


def hf_tokenizer(tokenizer: Tokenizer) -> Any:
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|endoftext|>", bos_token="<|endoftext|>"
    )


def test_a_transformers_tokenizer_resolves_to_the_same_backend_and_eos(
    tokenizer: Tokenizer,
) -> None:
    direct = resolve_tokenizer(None, tokenizer, bos_token=None, eos_token=None)
    wrapped = resolve_tokenizer(None, hf_tokenizer(tokenizer), bos_token=None, eos_token=None)
    assert direct.digest == wrapped.digest
    assert direct.eos_id == wrapped.eos_id == tokenizer.token_to_id("<|endoftext|>")


def test_a_local_directory_saved_by_transformers_loads_with_its_special_tokens(
    tmp_path: Path, tokenizer: Tokenizer
) -> None:
    hf_tokenizer(tokenizer).save_pretrained(tmp_path / "tok")
    resolved = resolve_tokenizer(str(tmp_path / "tok"), None, bos_token=None, eos_token=None)
    assert resolved.eos_id == tokenizer.token_to_id("<|endoftext|>")
    assert (
        resolved.digest == resolve_tokenizer(None, tokenizer, bos_token=None, eos_token=None).digest
    )


def resolve_in_subprocess(tokenizer_id: str, hub_cache: Path) -> str:
    """Resolve in a fresh interpreter whose hub settings come from the environment, as a
    user's would (the hub libraries read them at import)."""
    code = (
        "from zephon_torch.ops._tokenizer import resolve_tokenizer\n"
        f"r = resolve_tokenizer({tokenizer_id!r}, None, bos_token=None, eos_token=None)\n"
        "print(r.digest, r.eos_id)\n"
    )
    env = {**os.environ, "HF_HUB_CACHE": str(hub_cache), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.stdout.strip() if done.returncode == 0 else "ERROR " + done.stderr


def test_a_hub_id_is_served_from_the_local_cache_offline(
    tmp_path: Path, tokenizer: Tokenizer
) -> None:
    saved = tmp_path / "saved"
    hf_tokenizer(tokenizer).save_pretrained(saved)
    repo = tmp_path / "hub" / "models--zephon--tiny-bpe"
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for file in saved.iterdir():
        shutil.copy(file, snapshot / file.name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    direct = resolve_tokenizer(None, tokenizer, bos_token=None, eos_token=None)
    assert (
        resolve_in_subprocess("zephon/tiny-bpe", tmp_path / "hub")
        == f"{direct.digest} {direct.eos_id}"
    )
    missing = resolve_in_subprocess("nobody/nothing", tmp_path / "hub")
    assert "ConfigError: cannot load tokenizer 'nobody/nothing'" in missing


@pytest.mark.parametrize("given", ["/no/such/tok", "./tok", "a/b/c", "tok.json"])
def test_a_path_that_is_not_there_is_said_to_be_missing_not_a_bad_hub_id(
    tmp_path: Path, given: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A missing tokenizer path was sent to the hub, whose HFValidationError ("Repo id must be
    in the form 'repo_name'") was all the user saw (a fresh-user trial)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"no such file or directory \(and a hub id reads") as e:
        resolve_tokenizer(given, None, bos_token=None, eos_token=None)
    assert f"cannot load tokenizer {given!r}" in str(e.value)
    assert "HFValidationError" not in str(e.value)


def test_every_form_of_the_same_tokenizer_gives_the_same_batches(
    tmp_path: Path, tokenizer: Tokenizer
) -> None:
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    reference = keys(small_pipeline(tokenizer))
    assert keys(small_pipeline(hf_tokenizer(tokenizer))) == reference
    p = small_pipeline(tokenizer)
    from zephon_torch import Pipeline

    by_path = (
        Pipeline(p._source)
        .tokenize(str(tmp_path / "tokenizer.json"), parallelism=2)
        .pack_flat(64)
        .batch(2)
    )
    assert keys(by_path) == reference


def test_the_users_tokenizer_keeps_its_own_truncation_setting(tokenizer: Tokenizer) -> None:
    own = Tokenizer.from_str(tokenizer.to_str())
    own.enable_truncation(4)
    resolved = resolve_tokenizer(None, own, bos_token=None, eos_token=None)
    assert own.truncation is not None
    assert len(resolved.backend.encode("a fairly long sentence with many words in it").ids) > 4


def test_pipelines_of_one_tokenizer_share_one_private_copy(tokenizer: Tokenizer) -> None:
    """Every resolve made a copy of its own; one that encoded kept 3-8 MB of native memory
    once dropped (tokenizers 0.23), so a job building a pipeline per evaluation grew without
    bound (about 7 MB per pipeline, measured). Another tokenizer, or another setting that
    decides ids, still gets its own."""
    first = resolve_tokenizer(None, tokenizer, bos_token=None, eos_token=None)
    again = resolve_tokenizer(None, tokenizer, bos_token=None, eos_token=None)
    assert again.backend is first.backend and first.backend is not tokenizer
    assert first.backend.post_processor is None and first.backend.truncation is None
    splitting = Tokenizer.from_str(tokenizer.to_str())
    splitting.encode_special_tokens = True
    split = resolve_tokenizer(None, splitting, bos_token=None, eos_token=None)
    assert split.backend is not first.backend and split.backend.encode_special_tokens
    assert not first.backend.encode_special_tokens
    other = Tokenizer.from_str(tokenizer.to_str())
    other.add_tokens(["zephonword"])
    assert resolve_tokenizer(None, other, bos_token=None, eos_token=None).backend not in (
        first.backend,
        split.backend,
    )
    for _ in range(20):  # the cache stays bounded
        more = Tokenizer.from_str(tokenizer.to_str())
        more.add_tokens([f"word{_}"])
        resolve_tokenizer(None, more, bos_token=None, eos_token=None)
    assert resolve_tokenizer(None, tokenizer, bos_token=None, eos_token=None).backend is not (
        first.backend
    )


def test_special_token_policies_add_the_ids_where_asked(tokenizer: Tokenizer) -> None:
    from zephon_torch.ops.document import Document
    from zephon_torch.ops.tokenize import TokenizeOp

    resolved = resolve_tokenizer(None, tokenizer, bos_token="<|endoftext|>", eos_token=None)
    plain = tokenizer.encode("hello world", add_special_tokens=False).ids
    special = resolved.eos_id
    for policy, expected in [
        ("none", plain),
        ("eos", [*plain, special]),
        ("bos", [special, *plain]),
        ("both", [special, *plain, special]),
    ]:
        op = TokenizeOp(
            resolved,
            field="text",
            special_tokens=policy,  # type: ignore[arg-type]
            dataset_names=["d"],
            shard_paths=[["s"]],
        )
        (doc,) = op([Document(0, 0, 0, 0, 0, {"text": "hello world"})])
        assert doc.tokens is not None and doc.tokens.tolist() == expected, policy


def test_a_tokenizer_json_file_takes_its_folders_special_tokens_as_the_folder_does(
    tmp_path: Path, tokenizer: Tokenizer
) -> None:
    """A saved folder whose config names another EOS than the usual candidates (as chat models'
    ``<|im_end|>``): its ``tokenizer.json`` given alone picks the same EOS as the folder, not
    the first usual name in the vocabulary."""
    own = Tokenizer.from_str(tokenizer.to_str())
    own.add_special_tokens(["<|im_end|>"])
    PreTrainedTokenizerFast(tokenizer_object=own, eos_token="<|im_end|>").save_pretrained(
        tmp_path / "tok"
    )
    folder = resolve_tokenizer(str(tmp_path / "tok"), None, bos_token=None, eos_token=None)
    file = resolve_tokenizer(
        str(tmp_path / "tok" / "tokenizer.json"), None, bos_token=None, eos_token=None
    )
    assert folder.eos_id == file.eos_id == own.token_to_id("<|im_end|>")
    assert folder.digest == file.digest
    # a file of another name is taken alone: its folder's config may belong to another
    shutil.copy(tmp_path / "tok" / "tokenizer.json", tmp_path / "tok" / "other.json")
    alone = resolve_tokenizer(
        str(tmp_path / "tok" / "other.json"), None, bos_token=None, eos_token=None
    )
    assert alone.eos_id == own.token_to_id("<|endoftext|>")


def test_unreadable_tokenizer_files_and_bad_token_names_are_config_errors_naming_them(
    tmp_path: Path, tokenizer: Tokenizer
) -> None:
    """Each was a bare Exception, JSONDecodeError, AttributeError or TypeError, most without
    the file's name."""
    import pytest

    from zephon_torch import ConfigError

    def refused(given: str, message: str, **names: Any) -> None:
        with pytest.raises(ConfigError, match=message):
            resolve_tokenizer(given, None, **{"bos_token": None, "eos_token": None, **names})

    not_json = tmp_path / "spm.model"
    not_json.write_bytes(b"\x0a\x0b not a tokenizers file")
    refused(str(not_json), r"cannot read tokenizer file '.*spm\.model'")
    folder = tmp_path / "tok"
    folder.mkdir()
    (folder / "tokenizer.json").write_text('{"version": ')
    refused(str(folder), r"cannot read tokenizer file '.*tok/tokenizer\.json'")
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text("{not json")
    refused(str(folder), r"cannot read '.*tok/tokenizer_config\.json'")
    (folder / "tokenizer_config.json").write_text('["eos"]')
    refused(str(folder), r"tokenizer_config\.json' must hold a JSON object, got a list")
    (folder / "tokenizer_config.json").write_text("{}")
    refused(str(folder), r"`bos_token` must be a token's text \(a str\), got 1", bos_token=1)
    assert resolve_tokenizer(str(folder), None, bos_token=None, eos_token=None).eos_id is not None


def test_a_tokenizer_without_special_tokens_is_told_of_special_tokens_none() -> None:
    """The advice was only `eos_token=`, which such a tokenizer cannot follow: every name is
    'not in the tokenizer's vocabulary'."""
    import pytest
    from tokenizers import models, pre_tokenizers, trainers

    from zephon_torch.errors import ConfigError
    from zephon_torch.ops.tokenize import TokenizeOp

    bare = Tokenizer(models.BPE())
    bare.pre_tokenizer = pre_tokenizers.ByteLevel()
    bare.train_from_iterator(
        ["plain text without special tokens"] * 20, trainers.BpeTrainer(vocab_size=300)
    )
    resolved = resolve_tokenizer(None, bare, bos_token=None, eos_token=None)
    with pytest.raises(
        ConfigError, match=r"`special_tokens='none'` for no token between documents"
    ):
        TokenizeOp(
            resolved, field="text", special_tokens="eos", dataset_names=["d"], shard_paths=[["s"]]
        )


def test_a_transformers_tokenizer_keeps_its_own_split_special_tokens_setting(
    tokenizer: Tokenizer,
) -> None:
    """transformers leaves a call's `split_special_tokens=` on its backend until the next
    call: read from there, one earlier call turned the tokenizer's own setting around, and a
    literal "<|endoftext|>" in a document became EOS (or stopped being it)."""
    eos = tokenizer.token_to_id("<|endoftext|>")
    text = "a page that quotes <|endoftext|> in its text"
    for setting in (True, False):
        hf = PreTrainedTokenizerFast(
            tokenizer_object=Tokenizer.from_str(tokenizer.to_str()),
            eos_token="<|endoftext|>",
            split_special_tokens=setting,
        )
        expected = hf(text, add_special_tokens=False)["input_ids"]
        assert (eos in expected) is not setting
        hf(text, split_special_tokens=not setting)  # one call with the other setting
        resolved = resolve_tokenizer(None, hf, bos_token=None, eos_token=None)
        assert resolved.split_special_tokens is setting
        assert resolved.backend.encode(text, add_special_tokens=False).ids == expected


def save_folder(folder: Path, backend: Tokenizer, **files: dict[str, Any]) -> Path:
    """``backend`` saved as ``tokenizer.json`` with the JSON ``files`` beside it."""
    import json

    folder.mkdir()
    backend.save(str(folder / "tokenizer.json"))
    for name, content in files.items():
        (folder / f"{name}.json").write_text(json.dumps(content))
    return folder


def test_a_folders_special_tokens_map_names_its_bos_and_eos_as_transformers_reads_it(
    tmp_path: Path, tokenizer: Tokenizer
) -> None:
    """A folder (or hub repository) of the kind written before `added_tokens_decoder`,
    naming its BOS and EOS only in `special_tokens_map.json`, got a candidate's ids instead
    ("<|endoftext|>"), with no word."""
    from transformers import PreTrainedTokenizerFast

    own = Tokenizer.from_str(tokenizer.to_str())
    own.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    named = {"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"}}
    cases = {
        "map only": {"special_tokens_map": named},
        "config without them, and the map": {
            "tokenizer_config": {"model_max_length": 2048},
            "special_tokens_map": named,
        },
        "config naming others, and the map": {
            "tokenizer_config": {"eos_token": "<|endoftext|>"},
            "special_tokens_map": named,
        },
    }
    for number, (case, files) in enumerate(cases.items()):
        folder = save_folder(tmp_path / f"tok{number}", own, **files)
        resolved = resolve_tokenizer(str(folder), None, bos_token=None, eos_token=None)
        reference = PreTrainedTokenizerFast.from_pretrained(str(folder))
        assert (
            (resolved.bos_id, resolved.eos_id)
            == (
                reference.bos_token_id,
                reference.eos_token_id,
            )
            == (own.token_to_id("<|im_start|>"), own.token_to_id("<|im_end|>"))
        ), case
    # a config with `added_tokens_decoder` (as transformers writes now) is read alone
    decoder = {"added_tokens_decoder": {}, "eos_token": "<|endoftext|>"}
    folder = save_folder(tmp_path / "new", own, tokenizer_config=decoder, special_tokens_map=named)
    resolved = resolve_tokenizer(str(folder), None, bos_token=None, eos_token=None)
    assert resolved.eos_id == own.token_to_id("<|endoftext|>")


def test_usual_names_are_taken_as_special_tokens_only_among_the_added_ones() -> None:
    """A BPE trained without special tokens may learn "</s>" as text: taken as EOS, every
    document ended with a text token, and no error said the tokenizer has none."""
    import pytest
    from tokenizers import models, pre_tokenizers, trainers

    from zephon_torch.errors import ConfigError
    from zephon_torch.ops.tokenize import TokenizeOp

    bare = Tokenizer(models.BPE())
    bare.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    bare.train_from_iterator(["</s> <s> text"] * 50, trainers.BpeTrainer(vocab_size=60))
    assert bare.token_to_id("</s>") is not None and bare.token_to_id("<s>") is not None
    resolved = resolve_tokenizer(None, bare, bos_token=None, eos_token=None)
    assert (resolved.bos_id, resolved.eos_id) == (None, None)
    with pytest.raises(ConfigError, match=r"needs an EOS token.*\(it has no special tokens\)"):
        TokenizeOp(
            resolved, field="text", special_tokens="eos", dataset_names=["d"], shard_paths=[["s"]]
        )
    # one of another name is listed, to be named (a fresh-user trial: "[END]")
    bare.add_special_tokens(["[END]"])
    resolved = resolve_tokenizer(None, bare, bos_token=None, eos_token=None)
    with pytest.raises(ConfigError, match=r"has none known \(its special tokens: \['\[END\]'\]\)"):
        TokenizeOp(
            resolved, field="text", special_tokens="eos", dataset_names=["d"], shard_paths=[["s"]]
        )
    # named, a vocabulary entry is the user's choice
    named = resolve_tokenizer(None, bare, bos_token=None, eos_token="</s>")
    assert named.eos_id == bare.token_to_id("</s>")


def test_a_vocabulary_that_cannot_encode_a_letter_a_still_resolves() -> None:
    """The check for a BOS the tokenizer adds itself encoded "a": a word-level vocabulary of
    other symbols, without an unknown token, failed the build with a bare Exception."""
    from tokenizers import models, pre_tokenizers

    dna = Tokenizer(models.WordLevel({"A": 0, "C": 1, "G": 2, "T": 3, "<eos>": 4}))
    dna.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    dna.add_special_tokens(["<eos>"])
    resolved = resolve_tokenizer(None, dna, bos_token=None, eos_token=None)
    assert resolved.eos_id == 4 and not resolved.adds_bos
    assert resolved.backend.encode("GATTACA").ids == [2, 0, 3, 3, 0, 1, 0]


def test_a_bos_added_by_a_vocabulary_that_cannot_encode_a_letter_a_is_known() -> None:
    """Its probe, "a", did not encode, and no BOS was known: a policy leaving BOS out of
    every document was not warned of. The vocabulary's own entries are probed then."""
    from tokenizers import models, pre_tokenizers
    from tokenizers.processors import TemplateProcessing

    dna = Tokenizer(models.WordLevel({"<s>": 0, "A": 1, "C": 2, "G": 3, "T": 4, "<eos>": 5}))
    dna.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    dna.add_special_tokens(["<s>", "<eos>"])
    dna.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    resolved = resolve_tokenizer(None, dna, bos_token="<s>", eos_token="<eos>")
    assert resolved.adds_bos and resolved.bos_id == 0


def test_a_path_given_as_tokenizer_is_read_as_the_first_argument_is(
    tmp_path: Path, tokenizer: Tokenizer
) -> None:
    tokenizer.save(str(tmp_path / "tok.json"))
    for given in (str(tmp_path / "tok.json"), tmp_path / "tok.json"):
        assert keys(small_pipeline(tokenizer=given)) == keys(small_pipeline(tokenizer=tokenizer))


def test_a_tokenizer_that_appends_its_bos_as_eos_is_not_taken_to_start_with_bos(
    tokenizer: Tokenizer,
) -> None:
    """GPT-NeoX style: one token is BOS and EOS, and the post-processing appends it. Probed
    on the empty text, it looked like a BOS put first, and the pipeline advised
    `special_tokens='both'`, an extra token before every document (review D2, finding 1)."""
    import warnings

    from tokenizers.processors import TemplateProcessing

    appends = Tokenizer.from_str(tokenizer.to_str())
    end = appends.token_to_id("<|endoftext|>")
    appends.post_processor = TemplateProcessing(
        single="$A <|endoftext|>", special_tokens=[("<|endoftext|>", end)]
    )
    resolved = resolve_tokenizer(
        None, appends, bos_token="<|endoftext|>", eos_token="<|endoftext|>"
    )
    assert not resolved.adds_bos
    with warnings.catch_warnings(record=True) as heard:
        warnings.simplefilter("always")
        small_pipeline(tokenizer=appends)
    assert not [w for w in heard if "starts every sequence with BOS" in str(w.message)]


def test_the_tokens_the_post_processing_inserts_are_bos_and_eos_whatever_their_names() -> None:
    """Only the usual names ("<s>", "</s>", ...) were looked for: a tokenizer whose own
    post-processing wraps every text in "[BOS]" ... "<|eos|>" had neither known, so its BOS
    was dropped without the promised warning, and `special_tokens="eos"` was refused. A name
    the user gives still wins; a template inserting two tokens names no single one."""
    from tokenizers import models, pre_tokenizers
    from tokenizers.processors import TemplateProcessing

    vocab = {"[UNK]": 0, "[BOS]": 1, "<|eos|>": 2, "<s>": 3, "hello": 4, "[SYS]": 5}

    def wrapped(single: str) -> Tokenizer:
        words = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
        words.pre_tokenizer = pre_tokenizers.Whitespace()
        words.add_special_tokens(["[BOS]", "<|eos|>", "<s>", "[SYS]"])
        words.post_processor = TemplateProcessing(
            single=single, special_tokens=[(t, vocab[t]) for t in ("[BOS]", "<|eos|>", "[SYS]")]
        )
        return words

    resolved = resolve_tokenizer(None, wrapped("[BOS] $A <|eos|>"), bos_token=None, eos_token=None)
    assert (resolved.bos_id, resolved.eos_id, resolved.adds_bos) == (1, 2, True)
    # before the usual "<s>", which this tokenizer has too but does not put first
    named = resolve_tokenizer(None, wrapped("[BOS] $A"), bos_token="<s>", eos_token=None)
    assert (named.bos_id, named.eos_id, named.adds_bos) == (3, None, False)
    two = resolve_tokenizer(None, wrapped("[BOS] [SYS] $A"), bos_token=None, eos_token=None)
    assert (two.bos_id, two.adds_bos) == (3, False)  # the usual "<s>", as before


def test_usual_names_the_post_processing_inserts_are_special_tokens(tokenizer: Tokenizer) -> None:
    """A converted tokenizer may keep its "[CLS]"/"[SEP]" (or "<s>") in the model's vocabulary,
    not among added tokens, and name them in its post-processing only."""
    from tokenizers import models, pre_tokenizers
    from tokenizers.processors import BertProcessing, Sequence, TemplateProcessing

    vocab = {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "<s>": 3, "hello": 4, "world": 5}
    labelled = TemplateProcessing(  # a template names its tokens by labels of its own
        single="start $A", special_tokens=[{"id": "start", "ids": [3], "tokens": ["<s>"]}]
    )
    for processor, expected in (
        (BertProcessing(("[SEP]", 2), ("[CLS]", 1)), (1, 2)),
        (Sequence([TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 3)])]), (3, None)),
        (labelled, (3, None)),
    ):
        words = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
        words.pre_tokenizer = pre_tokenizers.Whitespace()
        words.post_processor = processor
        resolved = resolve_tokenizer(None, words, bos_token=None, eos_token=None)
        assert (resolved.bos_id, resolved.eos_id) == expected
        assert resolved.adds_bos


def test_a_folder_saved_to_split_special_tokens_is_read_so(
    tmp_path: Path, tokenizer: Tokenizer
) -> None:
    """transformers saves `split_special_tokens` in tokenizer_config.json: the folder's path
    gave other ids than the folder loaded by transformers (review D2, finding 7)."""
    from transformers import AutoTokenizer

    text = "a page that quotes <|endoftext|> in its text"
    for setting in (True, False):
        folder = tmp_path / f"split-{setting}"
        PreTrainedTokenizerFast(
            tokenizer_object=Tokenizer.from_str(tokenizer.to_str()),
            eos_token="<|endoftext|>",
            split_special_tokens=setting,
        ).save_pretrained(folder)
        resolved = resolve_tokenizer(str(folder), None, bos_token=None, eos_token=None)
        expected = AutoTokenizer.from_pretrained(str(folder))(text, add_special_tokens=False)
        assert resolved.split_special_tokens is setting
        assert resolved.backend.encode(text, add_special_tokens=False).ids == expected["input_ids"]
