"""The README's quickstart, runnable in one process and offline: a JSONL and a Parquet source
written here, a BPE tokenizer trained here, mixed 70:30 by tokens; saves the data position at a
step, resumes it in a fresh pipeline and checks the batches continue exactly.

    python examples/quickstart.py [--steps 12] [--save-at 5] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from zephon_torch import Pipeline
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource, TokenEstimation

WORDS = ["the", "data", "loader", "mixes", "packs", "and", "tokenizes", "documents", "online"]


def write_data(root: Path) -> None:
    """`wiki/` as two JSONL files and `code/` as one Parquet file, made-up text (the same at
    every run: a folder written before is written again)."""
    rng = random.Random(0)
    (root / "wiki").mkdir(parents=True, exist_ok=True)
    for part in range(2):
        lines = [json.dumps({"text": " ".join(rng.choices(WORDS, k=rng.randint(5, 300)))})]
        lines += [
            json.dumps({"text": " ".join(rng.choices(WORDS, k=rng.randint(5, 300)))})
            for _ in range(199)
        ]
        (root / "wiki" / f"part-{part}.jsonl").write_text("\n".join(lines) + "\n")
    (root / "code").mkdir(exist_ok=True)
    code = [f"def f{i}(x):\n    return x * {i}\n" * rng.randint(1, 20) for i in range(400)]
    pq.write_table(pa.table({"text": code}), root / "code" / "part-0.parquet")


def train_tokenizer(root: Path) -> Tokenizer:
    """A small byte-level BPE with an end-of-text token, trained on the data."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    texts = [json.loads(line)["text"] for line in (root / "wiki" / "part-0.jsonl").open()]
    texts += pq.read_table(root / "code").column("text").to_pylist()
    trainer = trainers.BpeTrainer(
        vocab_size=1000, special_tokens=["<|endoftext|>"], show_progress=False
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def make_pipeline(root: Path, tokenizer: Tokenizer) -> Pipeline:
    wiki = Dataset.from_path("wiki", root / "wiki")  # a file, a directory or a glob
    code = Dataset.from_path("code", str(root / "code" / "*.parquet"))
    source = StaticMixtureWorkSource(
        datasets=[wiki, code],
        mixture={"wiki": 0.7, "code": 0.3},
        token_estimation=TokenEstimation(),  # token shares, not document shares
        exhaustion="repeat",  # the shares hold for the whole run; stop on a step budget
        seed=42,
    )
    return (
        Pipeline(source)
        .options(canonical_replicas=8, world_size=1, rank=0)  # one rank owns all 8 lanes
        .tokenize(tokenizer, field="text", eos_token="<|endoftext|>", parallelism=2)
        .pack_flat(max_length=512, algorithm="wrap")
        .batch(microbatch_size=4)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--save-at", type=int, default=5)
    parser.add_argument(
        "--out", default=None, help="folder for the data (default: a temporary one)"
    )
    args = parser.parse_args()
    if not 0 < args.save_at < args.steps:
        parser.error(f"--save-at must lie in [1, --steps), got {args.save_at} of {args.steps}")
    root = Path(args.out or tempfile.mkdtemp(prefix="zephon-quickstart-"))
    write_data(root)
    tokenizer = train_tokenizer(root)

    pipeline = make_pipeline(root, tokenizer)
    per_step = len(pipeline.lanes)  # this rank's micro-batches per global step
    seen, saved = [], None
    for i, batch in enumerate(pipeline):
        inputs = batch.to_training()  # input_ids, labels, position_ids, cu_seqlens, ...
        seen.append(inputs["input_ids"].tolist())
        if (i + 1) % per_step == 0:  # a global step's end
            step = (i + 1) // per_step
            if step == args.save_at:
                saved = json.dumps(pipeline.state_dict())  # plain JSON, kilobytes
            if step == args.steps:
                break
    shares = {name: round(share, 3) for name, share in pipeline.stats()["delivered_shares"].items()}
    print(f"{args.steps} steps of {per_step} x [4, 512]; token shares {shares} (target 0.7/0.3)")

    resumed = make_pipeline(root, tokenizer)  # a fresh process would build it the same way
    resumed.load_state_dict(json.loads(saved))
    again = [
        b.to_training()["input_ids"].tolist()
        # the expected list first: zip stops on it before it pulls a micro-batch too many
        for _, b in zip(seen[args.save_at * per_step :], resumed)
    ]
    exact = again == seen[args.save_at * per_step :]
    print(f"state saved at step {args.save_at} ({len(saved)} bytes); resumed exactly: {exact}")
    if not exact:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
