"""Tokenizing as the model sees it: chat conversations encoded whole (SentencePiece-style
tokenizers), the user's split_special_tokens kept, BPE dropout refused, whole passes only; a
text the tokenizer cannot encode named as its row's fault."""

from __future__ import annotations

import copy
import json
import warnings
from typing import Any

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from zephon_torch import DataError, Pipeline
from zephon_torch._corpus import pydoc_prose_documents
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource

CHATML_JINJA = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
)
SPECIALS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]


def sentencepiece_style(kind: str) -> Tokenizer:
    """A small Llama/Mistral-style BPE (byte fallback, "▁" for spaces) trained locally:
    ``"metaspace"`` as Mistral v0.3 / Llama (legacy=False) convert, ``"prepend"`` as the
    legacy Llama-2 tokenizer.json."""
    texts = [d["text"] for d in pydoc_prose_documents()]
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    if kind == "metaspace":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    else:
        tok.normalizer = normalizers.Sequence(
            [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
        )
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=800, special_tokens=SPECIALS))
    return tok


CONVERSATION = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "What is a list?"},
    {"role": "assistant", "content": "A mutable sequence."},
    {"role": "user", "content": "And a tuple?"},
    {"role": "assistant", "content": "An immutable one."},
]


@pytest.mark.parametrize("kind", ["metaspace", "prepend"])
def test_chat_tokens_are_those_of_the_rendered_conversation_for_sentencepiece_tokenizers(
    kind: str,
) -> None:
    """tokenize_chat must give the ids the model sees at inference: the chat template's text
    tokenized as a whole (transformers' apply_chat_template). Encoding each segment apart
    prepends a "▁" before every message with a Llama/Mistral-style tokenizer."""
    backend = sentencepiece_style(kind)
    hf = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>", bos_token="<s>")
    hf.chat_template = CHATML_JINJA
    text = hf.apply_chat_template(CONVERSATION, tokenize=False)
    expected = hf(text, add_special_tokens=False)["input_ids"]
    dataset = Dataset.from_dict("sft", {"messages": [CONVERSATION]})
    pipeline = (
        Pipeline(StaticMixtureWorkSource([dataset]))
        .tokenize_chat(tokenizer=hf)
        .pack_flat(len(expected) + 8, "best_fit")
        .batch(1)
    )
    batch = next(iter(pipeline))
    got = batch.input_ids[0, : batch.num_tokens].tolist()
    assert [backend.id_to_token(i) for i in got] == [backend.id_to_token(i) for i in expected]
    # the loss covers exactly the assistant answers and their end markers
    labels = batch.to_training()["labels"][0].tolist()
    targets = "".join(backend.id_to_token(i) for i in labels if i != -100)
    squeezed = "".join(c for c in targets.replace("<0x0A>", "") if c not in "▁ \n")
    assert squeezed == "Amutablesequence.<|im_end|>Animmutableone.<|im_end|>"


def test_split_special_tokens_set_by_the_user_is_kept(tokenizer: Tokenizer) -> None:
    """A user who tokenizes raw web/code text with ``split_special_tokens=True`` (so a page
    that spells "<|endoftext|>" does not get a fake end of document in its middle) must get
    that behaviour; the private copy of the backend dropped the setting, silently."""
    text = "Call gpt2 with <|endoftext|> between documents."
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|endoftext|>", split_special_tokens=True
    )
    expected = hf(text, add_special_tokens=False)["input_ids"]
    eos = tokenizer.token_to_id("<|endoftext|>")
    assert eos not in expected  # transformers keeps it as text
    dataset = Dataset.from_dict("web", {"text": [text]})
    raw = Tokenizer.from_str(tokenizer.to_str())
    raw.encode_special_tokens = True  # the same setting on a tokenizers object
    for tok, runner in ((hf, "threads"), (raw, "threads"), (hf, "processes")):
        pipeline = (
            Pipeline(StaticMixtureWorkSource([dataset]))
            .tokenize(tokenizer=tok, runner=runner, parallelism=1)  # type: ignore[arg-type]
            .pack_flat(len(expected) + 4, "best_fit")
            .batch(1)
        )
        batch = next(iter(pipeline))
        assert batch.input_ids[0, : batch.num_tokens].tolist() == [*expected, eos], runner


def test_fractional_passes_are_refused_not_truncated() -> None:
    """``passes={"small": 2.5}`` (up-sample by 2.5 epochs) silently read "small" twice; a
    plain float and a non-numeric mixture weight escaped as TypeError/ValueError instead of
    a ConfigError naming the argument."""
    from zephon_torch.errors import ConfigError

    small = Dataset.from_dict("small", {"text": ["a b c"] * 4})
    big = Dataset.from_dict("big", {"text": ["d e f"] * 8})
    with pytest.raises(ConfigError, match="`passes`"):
        StaticMixtureWorkSource([small, big], passes={"small": 2.5})
    with pytest.raises(ConfigError, match="`passes`"):
        StaticMixtureWorkSource([small, big], passes=1.5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="`mixture` weight of 'small'"):
        StaticMixtureWorkSource([small, big], {"small": "heavy", "big": 1})  # type: ignore[dict-item]
    assert StaticMixtureWorkSource([small, big], passes={"small": 3}).passes == (3, 1)
    assert StaticMixtureWorkSource([small, big], passes=2).passes == (2, 2)


def test_a_tokenizer_with_bpe_dropout_is_refused(tokenizer: Tokenizer) -> None:
    """BPE dropout tokenizes at random: two runs of the same recipe gave different batches,
    and a resume re-tokenizes the documents of open rows, whose saved token ranges then point
    into other ids. It was accepted silently."""
    from zephon_torch.errors import ConfigError

    noisy = Tokenizer.from_str(tokenizer.to_str())
    noisy.model.dropout = 0.1
    dataset = Dataset.from_dict("d", {"text": ["a few words of text"] * 4})
    with pytest.raises(ConfigError, match="dropout"):
        Pipeline(StaticMixtureWorkSource([dataset])).tokenize(tokenizer=noisy)


def test_a_chat_state_from_segment_by_segment_encoding_is_refused(tokenizer: Tokenizer) -> None:
    """Its carried pieces point at token ranges of the old encoding: loading it must fail loudly,
    naming the change."""
    from zephon_torch.errors import StateMismatchError

    dataset = Dataset.from_dict("sft", {"messages": [CONVERSATION] * 4})

    def build() -> Pipeline:
        return (
            Pipeline(StaticMixtureWorkSource([dataset]))
            .tokenize_chat(tokenizer=tokenizer)
            .pack_flat(16, "wrap")
            .batch(1)
        )

    pipeline = build()
    next(iter(pipeline))
    state = pipeline.state_dict()
    old = copy.deepcopy(state["fingerprint"])
    del old["ops"][0]["encoding"]  # as the segment-by-segment encoding's fingerprint was
    with pytest.raises(StateMismatchError, match="encoding"):
        build().load_state_dict({**state, "fingerprint": old})


def test_chatml_over_a_tokenizer_without_its_markers_warns(tokenizer: Tokenizer) -> None:
    dataset = Dataset.from_dict("sft", {"messages": [CONVERSATION]})

    def first_batch(tok: Any) -> None:
        pipeline = (
            Pipeline(StaticMixtureWorkSource([dataset]))
            .tokenize_chat(tokenizer=tok)
            .pack_flat(256, "best_fit")
            .batch(1)
        )
        next(iter(pipeline))

    assert tokenizer.token_to_id("<|im_start|>") is None
    with pytest.warns(UserWarning, match=r"has no <\|im_start\|> token"):
        first_batch(tokenizer)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first_batch(sentencepiece_style("metaspace"))  # holds the markers: no warning


def _answer_ends_in_spaces(messages: list[dict[str, Any]]) -> list[tuple[str, bool]]:
    out = []
    for m in messages:
        out.append((f"{m['role']}:", False))
        out.append((f" {m['content']}   ", m["role"] == "assistant"))
        out.append(("\n", False))
    return out


def test_chat_flags_ignore_a_post_processors_trimmed_offsets(tokenizer: Tokenizer) -> None:
    # GPT-2, RoBERTa and GPT-NeoX tokenizers trim whitespace off offsets in their ByteLevel
    # post-processor: a whitespace-only token's span becomes empty and lands on the next
    # segment's first character, so the answer's trailing-spaces token lost its flag.
    config = json.loads(tokenizer.to_str())
    config["post_processor"] = {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": True,
        "use_regex": True,
    }
    gpt2_like = Tokenizer.from_str(json.dumps(config))
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure."}]
    dataset = Dataset.from_dict("one", {"messages": [messages]})
    pipeline = Pipeline(StaticMixtureWorkSource([dataset])).tokenize_chat(
        tokenizer=gpt2_like, chat_template=_answer_ends_in_spaces
    )
    batch = next(iter(pipeline.pack_flat(64, "best_fit").batch(1)))
    ids = batch.to_training()["input_ids"][0].tolist()
    labels = batch.to_training()["labels"][0].tolist()
    spaces = gpt2_like.token_to_id("ĠĠĠ")
    assert spaces is not None and spaces in ids
    at = len(ids) - 1 - ids[::-1].index(spaces)  # the answer's trailing spaces: trainable
    assert labels[at - 1] == spaces, "the answer's last token is not a target"


@pytest.mark.parametrize("name", ["<s>", "[BOS]", "<|bos|>"])
def test_a_tokenizer_that_adds_bos_itself_warns_when_the_policy_leaves_it_out(
    tokenizer: Any, name: str
) -> None:
    """Llama, Mistral and Gemma tokenizers start every sequence with BOS; the pipeline adds
    special tokens by its own policy, whose default ("eos") dropped BOS without a word. A BOS
    of a name outside the usual ones ("[BOS]") was not known at all, nor warned of: the token
    the post-processing puts first is it."""
    from tokenizers.processors import TemplateProcessing

    starts = Tokenizer.from_str(tokenizer.to_str())
    starts.add_special_tokens([name])
    bos = starts.token_to_id(name)
    starts.post_processor = TemplateProcessing(single=f"{name} $A", special_tokens=[(name, bos)])
    source = StaticMixtureWorkSource([Dataset.from_dict("d", {"text": ["Hello world."] * 4})])

    def first_row(**tokenize: Any) -> list[int]:
        pipeline = Pipeline(source).tokenize(starts, parallelism=1, **tokenize)
        return list(next(iter(pipeline.pack_flat(16).batch(1))).input_ids[0].tolist())

    with warnings.catch_warnings(record=True) as heard:
        warnings.simplefilter("always")
        assert bos not in first_row()
    said = [w for w in heard if "starts every sequence with BOS itself, and " in str(w.message)]
    # once, as the pipeline is built, at the user's line (it came at every rebuild of the op,
    # from inside the library)
    assert [w.filename for w in said] == [__file__]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert first_row(special_tokens="both")[0] == bos
        Pipeline(source).tokenize(tokenizer, parallelism=1)  # no BOS of its own: no warning


def test_a_tokenizer_that_puts_several_tokens_first_is_warned_of_under_every_policy(
    tokenizer: Any,
) -> None:
    """A template of `<s> [INST] $A </s>`: the advice to pass `special_tokens='both'` (BOS and
    EOS, "as the model will see it") left `[INST]` out without a word (fresh-user trial C)."""
    from tokenizers.processors import TemplateProcessing

    wrapped = Tokenizer.from_str(tokenizer.to_str())
    wrapped.add_special_tokens(["<s>", "[INST]", "</s>"])
    ids = [(name, wrapped.token_to_id(name)) for name in ("<s>", "[INST]", "</s>")]
    wrapped.post_processor = TemplateProcessing(single="<s> [INST] $A </s>", special_tokens=ids)
    source = StaticMixtureWorkSource([Dataset.from_dict("d", {"text": ["Hello world."] * 4})])
    for policy, before in (("eos", "nothing"), ("both", "['<s>']"), ("none", "nothing")):
        with warnings.catch_warnings(record=True) as heard:
            warnings.simplefilter("always")
            Pipeline(source).tokenize(wrapped, parallelism=1, special_tokens=policy)
        said = [str(w.message) for w in heard]
        assert len(said) == 1, said
        assert said[0].startswith(
            "the tokenizer's own post-processing starts every text with ['<s>', '[INST]']; "
        )
        assert f"({policy!r}: {before} before it)" in said[0]


def test_chat_gives_no_special_tokens_advice_to_a_tokenizer_that_adds_bos(
    tokenizer: Any,
) -> None:
    """``tokenize_chat`` takes no ``special_tokens`` (its template renders them), yet a
    tokenizer whose post-processor adds BOS was told to pass ``special_tokens='both'``."""
    from tokenizers.processors import TemplateProcessing

    starts = Tokenizer.from_str(tokenizer.to_str())
    starts.add_special_tokens(["<s>"])
    bos = starts.token_to_id("<s>")
    starts.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure."}]
    source = StaticMixtureWorkSource([Dataset.from_dict("d", {"messages": [messages]})])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pipeline = Pipeline(source).tokenize_chat(
            tokenizer=starts, chat_template=_answer_ends_in_spaces
        )
        batch = next(iter(pipeline.pack_flat(64, "best_fit").batch(1)))
    assert bos not in batch.input_ids[0].tolist()  # the template renders none


def test_a_tokenizer_with_a_python_component_is_a_config_error(tokenizer: Any) -> None:
    """A pre-tokenizer written in Python encodes, but cannot be serialized: a bare
    ``Exception`` came out of ``tokenize``."""
    from tokenizers import NormalizedString, PreTokenizedString

    from zephon_torch.errors import ConfigError

    class Spaces:
        def split(self, i: int, text: NormalizedString) -> list[NormalizedString]:
            return text.split(" ", "isolated")

        def pre_tokenize(self, pretokenized: PreTokenizedString) -> None:
            pretokenized.split(self.split)

    custom = Tokenizer.from_str(tokenizer.to_str())
    custom.pre_tokenizer = pre_tokenizers.PreTokenizer.custom(Spaces())
    assert custom.encode("a b").ids
    source = StaticMixtureWorkSource([Dataset.from_dict("d", {"text": ["a b"]})])
    with pytest.raises(ConfigError, match=r"cannot be serialized.*built-in ones"):
        Pipeline(source).tokenize(tokenizer=custom)


def test_a_pad_id_past_the_tokenizers_vocabulary_is_warned_of(tokenizer: Tokenizer) -> None:
    """`pack_flat(pad_token_id=10**6)` filled padding with an id the model's embedding lacks,
    without a word (a fresh-user trial): it is warned of where it is set; ids in the
    vocabulary, and the default (EOS), are not."""
    dataset = Dataset.from_dict("d", {"text": ["some text"]})
    tokenized = Pipeline(StaticMixtureWorkSource([dataset])).tokenize(tokenizer=tokenizer)
    size = tokenizer.get_vocab_size(with_added_tokens=True)
    with pytest.warns(UserWarning, match=rf"`pad_token_id` {size} lies past .* \({size} ids\)"):
        tokenized.pack_flat(16, "best_fit", pad_token_id=size)
    with pytest.warns(UserWarning, match="lies past the tokenizer's vocabulary"):
        tokenized.pack_sequences(16, pad_token_id=10**6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batch = next(iter(tokenized.pack_flat(16, "best_fit", pad_token_id=size - 1).batch(1)))
        tokenized.pack_flat(16, "best_fit").batch(1)
    assert batch.input_ids[0, -1] == size - 1


def without_unknown_token() -> Tokenizer:
    """A word-level tokenizer naming an unknown token it does not hold: it encodes the words
    it knows and raises a bare ``Exception`` on any other, as the backend does."""
    vocabulary = {"<|endoftext|>": 0, "red": 1, "green": 2, "blue": 3}
    tok = Tokenizer(models.WordLevel(vocabulary, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<|endoftext|>"])
    return tok


def colours(bad_rows: str, *, refused: str, runner: str = "threads") -> Pipeline:
    texts = [" ".join(["red", "green", "blue"][: 1 + i % 3]) for i in range(12)]
    texts[7] = refused
    source = StaticMixtureWorkSource([Dataset.from_dict("colours", {"text": texts}, shard_size=5)])
    recipe = Pipeline(source).options(bad_rows=bad_rows)  # type: ignore[arg-type]
    tokenized = recipe.tokenize(tokenizer=without_unknown_token(), runner=runner, parallelism=2)  # type: ignore[arg-type]
    return tokenized.pack_flat(8, "wrap").batch(2)


@pytest.mark.parametrize("runner", ["threads", "inline", "processes"])
def test_a_text_the_tokenizer_cannot_encode_is_a_data_error_naming_its_row(runner: str) -> None:
    """The backend's bare ``Exception`` named no dataset, shard or row, and ended the run
    under ``bad_rows="skip"`` too."""
    with pytest.raises(DataError, match=r"row 2: field 'text' cannot be encoded") as raised:
        list(colours("raise", refused="red purple", runner=runner))
    assert (raised.value.dataset, raised.value.shard) == ("colours", "memory://colours/1")
    assert "Missing [UNK] token" in str(raised.value.__cause__)


def test_a_text_the_tokenizer_cannot_encode_is_skipped_as_an_empty_row() -> None:
    skipping = colours("skip", refused="red purple")
    with pytest.warns(UserWarning, match=r"row 2: field 'text' cannot be encoded"):
        got = [batch.input_ids.tobytes() for batch in skipping]
    emptied = [batch.input_ids.tobytes() for batch in colours("raise", refused="")]
    assert got == emptied
    assert skipping.stats()["skipped_documents"]["malformed"] == 1
