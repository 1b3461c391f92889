"""What `bad_rows="skip"` costs: the pipeline over a corpus with bad rows against the same
corpus with those rows emptied, in one run.

The demo's prose and code (JSONL), cut into rows of `--chars` characters (about 500 tokens),
are copied twice per rate: once with a seeded share of their rows replaced by malformed JSON
(read with `options(bad_rows="skip")`), once with those rows replaced by `{"text": ""}` (read
as they are: an empty row gives no tokens, as a skipped one). Both give the same tokens
(checked: exit code 2 otherwise). Each is read once through `tokenize -> pack_flat(2048,
"wrap") -> batch(8)` (threads runner, one lane, one pass), the sides interleaved per repeat,
best of `--repeats`. The ratio is skip over clean tokens/s: what finding the bad rows costs (each
stage cuts its list around the row an error names and tries that row alone), with no bad row
(rate 0: the fast path) and at the rates given.

    .venv/bin/python benchmarks/bad_rows.py [--rates 0 0.001 0.01] [--repeats 3] [--chars 2000]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import sys
import tempfile
import time
import warnings

from zephon_torch import Pipeline
from zephon_torch._corpus import demo_corpus, demo_tokenizer
from zephon_torch.io import Dataset
from zephon_torch.work import StaticMixtureWorkSource

_MISMATCH_EXIT = 2
_BAD_LINE = '{"text": "a line cut short'


def copy_with_bad_rows(
    folder: pathlib.Path, out: pathlib.Path, rate: float, *, bad: bool, chars: int
) -> int:
    """The JSONL shards of ``folder`` into ``out``, each text cut into rows of ``chars``
    characters (web-text-like rows, not whole files), with a seeded ``rate`` of the rows
    malformed (``bad``) or emptied; returns how many rows were."""
    rng = random.Random(f"{folder.name}-{rate}")
    out.mkdir(parents=True)
    hit = 0
    for shard in sorted(folder.glob("part-*.jsonl")):
        texts = [json.loads(line)["text"] for line in shard.read_text("utf-8").splitlines()]
        lines = [
            json.dumps({"text": text[at : at + chars]})
            for text in texts
            for at in range(0, len(text), chars)
        ]
        for i in range(len(lines)):
            if rng.random() < rate:
                lines[i] = _BAD_LINE if bad else '{"text": ""}'
                hit += 1
        (out / shard.name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    return hit


def build(folders: list[pathlib.Path], tokenizer: object, bad_rows: str) -> Pipeline:
    # the same names on both sides (the pointer streams are keyed by them)
    datasets = [Dataset.from_path(name, f) for name, f in zip(("code", "prose"), folders)]
    source = StaticMixtureWorkSource(datasets, {"code": 0.5, "prose": 0.5}, seed=0)
    return (
        Pipeline(source)
        .options(bad_rows=bad_rows)  # type: ignore[arg-type]
        .tokenize(tokenizer=tokenizer, parallelism=2)
        .pack_flat(2048, "wrap")
        .batch(8)
    )


def tokens_of(pipeline: Pipeline) -> tuple[int, float, int]:
    """Real tokens of one pass, its seconds, and the malformed rows it skipped."""
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the skip warning, once per dataset
        tokens = sum(batch.num_tokens for batch in pipeline)
    seconds = time.perf_counter() - start
    return tokens, seconds, pipeline.stats()["skipped_documents"]["malformed"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--rates", type=float, nargs="+", default=[0.0, 0.001, 0.01])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--chars", type=int, default=2000, help="characters per row")
    args = p.parse_args(argv)
    code, prose = demo_corpus()
    tokenizer, _ = demo_tokenizer()
    with tempfile.TemporaryDirectory(prefix="zephon-bad-rows-") as tmp:
        root = pathlib.Path(tmp)
        print(f"{'bad rows':>9}  {'lines':>7}  {'clean M tok/s':>13}  {'skip M tok/s':>12}  ratio")
        for rate in args.rates:
            sides = {}
            for bad in (False, True):
                where = root / f"{rate}-{'bad' if bad else 'clean'}"
                hits = [
                    copy_with_bad_rows(folder, where / folder.name, rate, bad=bad, chars=args.chars)
                    for folder in (code, prose)
                ]
                folders = [where / code.name, where / prose.name]
                sides[bad] = (folders, sum(hits))
            best = {False: 0.0, True: 0.0}
            counts = set()
            for _ in range(args.repeats):
                for bad in (False, True):
                    folders, _ = sides[bad]
                    mode = "skip" if bad else "raise"
                    tokens, seconds, skipped = tokens_of(build(folders, tokenizer, mode))
                    counts.add(tokens)
                    if bad and skipped != sides[True][1]:
                        print(f"MISMATCH: skipped {skipped} rows, {sides[True][1]} are bad")
                        return _MISMATCH_EXIT
                    best[bad] = max(best[bad], tokens / seconds)
            if len(counts) != 1:
                print(f"MISMATCH: token counts {sorted(counts)} at rate {rate}")
                return _MISMATCH_EXIT
            print(
                f"{rate:>9.2%}  {sides[True][1]:>7,}  {best[False] / 1e6:>13.3f}  "
                f"{best[True] / 1e6:>12.3f}  {best[True] / best[False]:.3f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
