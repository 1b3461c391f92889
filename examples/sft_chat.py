"""Supervised fine-tuning data, offline and in one process: conversations written as JSONL,
checked as a job will read them (`zephon-torch inspect --validate --chat-field`), tokenized
with the chatml template by a BPE trained here (chatml's markers its special tokens), packed,
and trained on the assistant turns alone. It checks that every trained token (a label other
than -100) is assistant text or the end marker of an assistant turn, and that the batches
resume exactly from a saved state.

    python examples/sft_chat.py [--steps 8] [--save-at 3] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from zephon_torch import Pipeline
from zephon_torch.cli import main as cli
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource

# words of the user turns and of the assistant turns, apart, so the trained text can be told
USER_WORDS = ["why", "does", "my", "run", "stall", "when", "shards", "grow", "how", "can", "I"]
ASSISTANT_WORDS = ["because", "prefetch", "downloads", "ahead", "raise", "budget", "bytes"]
SPECIAL = ["<|im_start|>", "<|im_end|>"]


def write_data(root: Path) -> None:
    """`sft/` as two JSONL files of 300 conversations each: a system turn in some, then one to
    three user and assistant turns (the same at every run)."""
    rng = random.Random(0)
    (root / "sft").mkdir(parents=True, exist_ok=True)
    for part in range(2):
        lines = []
        for _ in range(300):
            turns = [{"role": "system", "content": "Be brief."}] if rng.random() < 0.3 else []
            for _ in range(rng.randint(1, 3)):
                asked = " ".join(rng.choices(USER_WORDS, k=rng.randint(3, 20)))
                answer = " ".join(rng.choices(ASSISTANT_WORDS, k=rng.randint(3, 60)))
                turns += [
                    {"role": "user", "content": asked},
                    {"role": "assistant", "content": answer},
                ]
            lines.append(json.dumps({"messages": turns}))
        (root / "sft" / f"part-{part}.jsonl").write_text("\n".join(lines) + "\n")


def train_tokenizer(root: Path) -> Tokenizer:
    """A small byte-level BPE whose special tokens are chatml's markers (without them, the
    built-in template's markers would be tokenized as plain text, and a warning says so)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    texts = [
        f"{turn['role']}\n{turn['content']}"
        for line in (root / "sft" / "part-0.jsonl").open()
        for turn in json.loads(line)["messages"]
    ]
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIAL, show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def make_pipeline(root: Path, tokenizer: Tokenizer) -> Pipeline:
    source = StaticMixtureWorkSource([Dataset.from_path("sft", root / "sft")], seed=7)
    return (
        Pipeline(source)
        .options(canonical_replicas=2)  # this process owns both lanes
        .tokenize_chat(tokenizer=tokenizer, field="messages")  # chatml by default
        .pack_flat(max_length=256, algorithm="best_fit")  # whole conversations where they fit
        .batch(microbatch_size=4)
    )


def trained_words(tokenizer: Tokenizer, labels: list[int]) -> set[str]:
    """The words of a row's trained tokens (labels other than -100), each marker one."""
    targets = [label for label in labels if label != -100]
    text = tokenizer.decode(targets, skip_special_tokens=False)
    for marker in SPECIAL:
        text = text.replace(marker, f" {marker} ")
    return set(text.split())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--save-at", type=int, default=3)
    parser.add_argument("--out", default=None, help="folder for the data (default: temporary)")
    args = parser.parse_args()
    if not 0 < args.save_at < args.steps:
        parser.error(f"--save-at must lie in [1, --steps), got {args.save_at} of {args.steps}")
    root = Path(args.out or tempfile.mkdtemp(prefix="zephon-sft-"))
    write_data(root)
    # what a job would stop on, before it starts: exit code 1 where a row is bad
    if cli(["inspect", str(root / "sft"), "--validate", "--chat-field", "messages", "--rows", "1"]):
        raise SystemExit("the conversations do not validate")
    tokenizer = train_tokenizer(root)

    pipeline = make_pipeline(root, tokenizer)
    per_step = len(pipeline.lanes)
    seen, saved, trained, total = [], None, 0, 0
    allowed = {*ASSISTANT_WORDS, "<|im_end|>"}
    for i, batch in enumerate(pipeline):
        inputs = batch.to_training(mask_document_boundaries=True)
        seen.append(inputs["input_ids"].tolist())
        for labels in inputs["labels"].tolist():
            stray = trained_words(tokenizer, labels) - allowed
            if stray:
                raise SystemExit(f"trained on words outside the assistant turns: {stray}")
            trained += sum(label != -100 for label in labels)
            total += len(labels)
        if (i + 1) % per_step == 0:
            step = (i + 1) // per_step
            if step == args.save_at:
                saved = json.dumps(pipeline.state_dict())
            if step == args.steps:
                break
    print(
        f"{args.steps} steps of {per_step} x [4, 256]: {trained / total:.1%} of the positions "
        "trained on, all of them assistant text or its end marker"
    )

    assert saved is not None
    resumed = make_pipeline(root, tokenizer)
    resumed.load_state_dict(json.loads(saved))
    expected = seen[args.save_at * per_step :]
    # the expected list first: zip stops on it before it pulls a micro-batch too many
    again = [b.to_training()["input_ids"].tolist() for _, b in zip(expected, resumed)]
    exact = again == expected
    print(f"state saved at step {args.save_at} ({len(saved)} bytes); resumed exactly: {exact}")
    if not exact:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
