"""Chat/SFT: only assistant tokens are loss targets, through packing, shuffle and resume."""

from __future__ import annotations

import random
import warnings
from typing import Any

import pytest

from tests.conftest import prose_documents
from tests.helpers import assert_resumes_at_every_step
from zephon_torch import DataError, Pipeline
from zephon_torch.io import Dataset
from zephon_torch.ops.chat import chatml
from zephon_torch.work import StaticMixtureWorkSource


def conversations(count: int, seed: int) -> list[list[dict[str, str]]]:
    rng = random.Random(seed)
    texts = prose_documents(count * 4, seed=seed, max_words=40)
    out = []
    for i in range(count):
        turns = [{"role": "system", "content": "Answer briefly."}] if rng.random() < 0.5 else []
        for j in range(rng.randint(1, 2)):
            turns.append({"role": "user", "content": texts[4 * i + 2 * j]})
            turns.append({"role": "assistant", "content": texts[4 * i + 2 * j + 1]})
        out.append(turns)
    return out


def chat_pipeline(tokenizer: Any, algorithm: str = "best_fit", lanes: int = 1) -> Pipeline:
    dataset = Dataset.from_dict("sft", {"messages": conversations(30, seed=4)}, shard_size=8)
    source = StaticMixtureWorkSource([dataset], seed=2)
    return (
        Pipeline(source)
        .options(canonical_replicas=lanes)
        .tokenize_chat(tokenizer=tokenizer)
        .pack_flat(128, algorithm)  # type: ignore[arg-type]
        .batch(2)
    )


def test_labels_are_set_only_on_assistant_tokens(tokenizer: Any) -> None:
    messages = conversations(1, seed=9)[0]
    segments = chatml(messages)
    expected: list[int] = []
    trainable: list[bool] = []
    for text, flag in segments:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        expected += ids
        trainable += [flag] * len(ids)
    dataset = Dataset.from_dict("one", {"messages": [messages]})
    pipeline = Pipeline(StaticMixtureWorkSource([dataset])).tokenize_chat(tokenizer=tokenizer)
    batch = next(iter(pipeline.pack_flat(len(expected) + 5, "best_fit").batch(1)))
    t = batch.to_training()
    n = len(expected)
    assert t["input_ids"][0, :n].tolist() == expected
    labels = t["labels"][0].tolist()
    for i in range(n - 1):
        assert labels[i] == (expected[i + 1] if trainable[i + 1] else -100), i
    assert all(x == -100 for x in labels[n - 1 :])
    assert int(t["num_valid_tokens"]) == sum(trainable[1:])


def test_chat_pipelines_with_shuffle_resume_at_every_step(tokenizer: Any) -> None:
    assert_resumes_at_every_step(lambda: chat_pipeline(tokenizer, "best_fit", lanes=2).shuffle(3))


def test_chat_with_wrap_keeps_the_flags_on_documents_cut_across_rows(tokenizer: Any) -> None:
    batches = list(chat_pipeline(tokenizer, "wrap"))
    assert any(not all(row_starts) for b in batches for row_starts in b.starts_document)
    for b in batches:
        t = b.to_training()
        assert int(t["num_valid_tokens"]) < b.num_tokens  # user turns never count


def test_malformed_messages_name_the_row(tokenizer: Any) -> None:
    dataset = Dataset.from_dict("sft", {"messages": [[{"role": "user", "content": "hi"}], "oops"]})
    pipeline = Pipeline(StaticMixtureWorkSource([dataset], shuffle=False)).tokenize_chat(
        tokenizer=tokenizer
    )
    with pytest.raises(DataError, match=r"row 1: field 'messages' must be a list"):
        list(pipeline.pack_flat(64).batch(1))


def test_a_lone_surrogate_in_a_message_names_the_row(tokenizer: Any) -> None:
    lone = [{"role": "user", "content": "\ud800"}]  # not valid Unicode
    dataset = Dataset.from_dict("sft", {"messages": [[{"role": "user", "content": "hi"}], lone]})
    pipeline = Pipeline(StaticMixtureWorkSource([dataset], shuffle=False)).tokenize_chat(
        tokenizer=tokenizer
    )
    with pytest.raises(DataError, match=r"row 1: field 'messages' is not valid Unicode text"):
        list(pipeline.pack_flat(64).batch(1))


def _roles_i_know(messages: list[dict[str, Any]]) -> list[tuple[str, bool]]:
    prefix = {"user": "Q: ", "assistant": "A: "}
    return [(prefix[m["role"]] + m["content"] + "\n", m["role"] == "assistant") for m in messages]


def test_a_user_template_failing_on_a_row_names_the_row(tokenizer: Any) -> None:
    tool = [{"role": "tool", "content": "42"}]
    dataset = Dataset.from_dict("sft", {"messages": [[{"role": "user", "content": "hi"}], tool]})
    pipeline = Pipeline(StaticMixtureWorkSource([dataset], shuffle=False)).tokenize_chat(
        tokenizer=tokenizer, chat_template=_roles_i_know
    )
    with pytest.raises(DataError, match=r"row 1: chat template '.*_roles_i_know' raised KeyError"):
        list(pipeline.pack_flat(64).batch(1))


def _a_bad_segment_for_tools(messages: list[dict[str, Any]]) -> list[Any]:
    return [(m["content"],) if m["role"] == "tool" else (m["content"], True) for m in messages]


def test_a_user_template_s_malformed_segment_names_the_row(tokenizer: Any) -> None:
    """It failed later, in the pipeline's own code, with a bare ValueError and no row."""
    tool = [{"role": "tool", "content": "42"}]
    dataset = Dataset.from_dict("sft", {"messages": [[{"role": "user", "content": "hi"}], tool]})
    pipeline = Pipeline(StaticMixtureWorkSource([dataset], shuffle=False)).tokenize_chat(
        tokenizer=tokenizer, chat_template=_a_bad_segment_for_tools
    )
    with pytest.raises(DataError, match=r"row 1: .* segment 0 is \('42',\), not a \(text"):
        list(pipeline.pack_flat(64).batch(1))


CHATML_JINJA = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{% else %}{{ message['content'] + '<|im_end|>' + '\n' }}{% endif %}"
    "{% endfor %}"
)


def test_chatml_ids_and_trainable_flags_are_transformers_assistant_masks(tokenizer: Any) -> None:
    """The built-in chatml trained on the newline after each assistant `<|im_end|>` too: after
    the stop token, the model learnt to go on."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer.from_str(tokenizer.to_str())
    backend.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    hf = PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<|im_end|>", chat_template=CHATML_JINJA
    )
    messages = conversations(6, seed=3)
    dataset = Dataset.from_dict("sft", {"messages": messages})
    source = StaticMixtureWorkSource([dataset], shuffle=False)
    chat = Pipeline(source).tokenize_chat(tokenizer=hf)
    pipeline = chat.pack_flat(4096, "best_fit", max_sequences_per_bin=1).batch(1)
    for batch, conversation in zip(pipeline, messages, strict=True):
        rendered = hf.apply_chat_template(
            conversation, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        n = batch.num_tokens
        assert batch.input_ids[0, :n].tolist() == list(rendered["input_ids"])
        assert batch.trainable is not None
        assert batch.trainable[0, :n].tolist() == [bool(m) for m in rendered["assistant_masks"]]


def _template_with(answer_prefix: str) -> Any:
    def template(messages: list[dict[str, Any]]) -> list[tuple[str, bool]]:
        out = []
        for message in messages:
            assistant = message["role"] == "assistant"
            prefix = answer_prefix if assistant else "Q: "
            out.append((prefix + message["content"] + "\n", assistant))
        return out

    return template


def test_templates_of_one_factory_are_told_apart_by_their_template_name(tokenizer: Any) -> None:
    """Two templates made by one factory share their qualified name, the fingerprint's only
    mark of a callable template: a state of one loaded into the other without a word, and
    continued on other tokens. ``template_name`` tells them apart."""
    from zephon_torch.errors import StateMismatchError

    dataset = Dataset.from_dict("sft", {"messages": conversations(12, seed=4)}, shard_size=4)

    def pipeline(prefix: str, name: str | None) -> Pipeline:
        template = _template_with(prefix)
        chat = Pipeline(StaticMixtureWorkSource([dataset], seed=2)).tokenize_chat(
            tokenizer=tokenizer, chat_template=template, template_name=name
        )
        return chat.pack_flat(64).batch(2)

    first = pipeline("A: ", "answers")
    next(iter(first))
    state = first.state_dict()
    with pytest.raises(StateMismatchError, match="chat_template"):
        pipeline("### Response:\n", "responses").load_state_dict(state)
    again = pipeline("A: ", "answers")
    again.load_state_dict(state)  # the same name: accepted
    assert next(iter(again)).input_ids.tolist() == next(iter(first)).input_ids.tolist()
    # without a name the fingerprint holds the qualified name, the same for both
    unnamed = pipeline("A: ", None).fingerprint()
    assert unnamed == pipeline("### Response:\n", None).fingerprint()
    assert "template_with.<locals>.template" in str(unnamed)


def test_the_chatml_warning_follows_the_template_not_its_name(tokenizer: Any) -> None:
    """The warning of chatml over a tokenizer without its markers looked at the fingerprint
    name: chatml named otherwise went unwarned, a template of one's own named 'chatml' was."""
    import warnings

    dataset = Dataset.from_dict("sft", {"messages": conversations(2, seed=1)})

    def build(template: Any, name: str) -> None:
        Pipeline(StaticMixtureWorkSource([dataset])).tokenize_chat(
            tokenizer=tokenizer, chat_template=template, template_name=name
        ).pack_flat(64).batch(1).fingerprint()

    with pytest.warns(UserWarning, match="has no <\\|im_start\\|> token"):
        build("chatml", "chatml-v2")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build(_template_with("A: "), "chatml")


@pytest.mark.parametrize("role", ["model", "gpt", "Assistant"])
def test_chatml_refuses_a_role_it_does_not_know_naming_the_row(tokenizer: Any, role: str) -> None:
    """An assistant turn spelt otherwise trained nothing, without a word (review H, F2)."""
    turns = [{"role": "user", "content": "hi"}, {"role": role, "content": "hello"}]
    good = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    dataset = Dataset.from_dict("sft", {"messages": [good, turns]})
    pipeline = Pipeline(StaticMixtureWorkSource([dataset], shuffle=False)).tokenize_chat(
        tokenizer=tokenizer
    )
    with pytest.raises(
        DataError,
        match=rf"dataset 'sft', .*row 1: chat template 'chatml' raised ValueError: message 1 "
        rf"has role '{role}'; chatml knows \['system', 'user', 'assistant', 'tool'\]",
    ):
        list(pipeline.pack_flat(64).batch(1))


@pytest.mark.parametrize(
    ("message", "fault"),
    [
        ({"role": "user", "content": None}, "message 1's 'content' is None"),
        ({"role": "user", "content": [{"type": "text"}]}, "message 1's 'content' is a list"),
        ({"content": "hi"}, "message 1's 'role' is missing"),
        ("hi", "message 1 is a str"),
        ({"role": 1, "content": "hi"}, "message 1's 'role' is an int"),
        (None, "message 1 is None"),
    ],
)
def test_a_malformed_message_is_named_by_its_place(
    tokenizer: Any, message: Any, fault: str
) -> None:
    turns = [{"role": "system", "content": "be brief"}, message]
    dataset = Dataset.from_dict("sft", {"messages": [turns]})
    pipeline = Pipeline(StaticMixtureWorkSource([dataset], shuffle=False)).tokenize_chat(
        tokenizer=tokenizer
    )
    with pytest.raises(DataError, match=rf"row 0: field 'messages' must be a list of .*: {fault}"):
        list(pipeline.pack_flat(64).batch(1))


def test_chatml_over_a_tokenizer_that_splits_special_tokens_warns_once_at_the_users_line(
    tokenizer: Any,
) -> None:
    """Set to split special tokens, the tokenizer splits the template's own markers as text:
    chat data no model sees at inference, without a word (review K, finding 3). The warnings
    of a tokenizer's use point at the user's line, once per build, not into the library at
    every rebuild of the op."""
    import warnings

    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer.from_str(tokenizer.to_str())
    backend.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    dataset = Dataset.from_dict("sft", {"messages": conversations(4, seed=2)})
    source = StaticMixtureWorkSource([dataset], shuffle=False)
    for split in (True, False):
        hf = PreTrainedTokenizerFast(tokenizer_object=backend, split_special_tokens=split)
        with warnings.catch_warnings(record=True) as heard:
            warnings.simplefilter("always")
            pipeline = Pipeline(source).tokenize_chat(tokenizer=hf).pack_flat(64).batch(1)
            ids = [batch.input_ids for batch in pipeline]
        start = backend.token_to_id("<|im_start|>")
        assert any(start in batch for batch in ids) is not split
        said = [w for w in heard if "split special tokens" in str(w.message)]
        assert len(said) == int(split), [str(w.message) for w in heard]
        if said:
            assert said[0].filename == __file__


def test_a_template_that_marks_nothing_trainable_is_warned_of_once(tokenizer: Any) -> None:
    """A template whose flags missed the assistant's turns trained on nothing, every label
    -100, without a word (a fresh-user trial)."""
    dataset = Dataset.from_dict("sft", {"messages": conversations(6, seed=3)}, shard_size=2)

    def first_batches(template: Any) -> list[Any]:
        pipeline = Pipeline(StaticMixtureWorkSource([dataset], seed=1)).tokenize_chat(
            tokenizer=tokenizer, chat_template=template, template_name="t"
        )
        return list(pipeline.pack_flat(64, "best_fit").batch(1))

    def untrained(messages: list[dict[str, str]]) -> list[tuple[str, bool]]:
        return [(f"{m['role']}: {m['content']}\n", False) for m in messages]

    with pytest.warns(
        UserWarning,
        match=r"dataset 'sft', shard .* row \d+: chat template 't' "
        r"marks no token of this conversation trainable",
    ) as caught:
        batches = first_batches(untrained)
    assert all(int(b.to_training()["num_valid_tokens"]) == 0 for b in batches)
    assert sum("marks no token" in str(w.message) for w in caught) == 1  # once

    def trained(messages: list[dict[str, str]]) -> list[tuple[str, bool]]:
        return [
            (text, m["role"] == "assistant") for (text, _), m in zip(untrained(messages), messages)
        ]

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert any(int(b.to_training()["num_valid_tokens"]) for b in first_batches(trained))
