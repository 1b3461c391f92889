"""Lightning: a tiny model checkpointed mid-epoch and resumed from the file sees the same data;
the elastic sampler is left alone by Lightning's distributed-sampler wrapping."""

from __future__ import annotations

import hashlib
import json
import re
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from tests.helpers import on_measured_text, small_pipeline, two_sources
from zephon_torch.elastic import ElasticDistributedSampler
from zephon_torch.lightning import PipelineDataModule

DATASETS = two_sources(30, 20, shard_size=8)


class TinyLM(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(1024, 16)
        self.head = torch.nn.Linear(16, 1024)
        self.seen: list[str] = []

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self.seen.append(hashlib.sha256(batch["input_ids"].numpy().tobytes()).hexdigest())
        logits = self.head(self.embed(batch["input_ids"]))
        return torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100
        )

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def trainer(root: Path, every: int, **limits: int) -> L.Trainer:
    """A quiet CPU trainer checkpointing into ``root`` every ``every`` steps."""
    return L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        callbacks=[
            L.pytorch.callbacks.ModelCheckpoint(
                dirpath=root, every_n_train_steps=every, save_top_k=-1
            )
        ],
        **limits,
    )


def fit(
    tokenizer: Any,
    root: Path,
    max_steps: int,
    ckpt_path: str | None = None,
    *,
    lanes: int = 2,
    every: int = 4,
) -> TinyLM:
    torch.manual_seed(0)
    model = TinyLM()
    data = PipelineDataModule(
        small_pipeline(tokenizer, lanes=lanes, exhaustion="repeat", datasets=DATASETS)
    )
    trainer(root, every, max_steps=max_steps).fit(model, datamodule=data, ckpt_path=ckpt_path)
    return model


def test_resume_from_a_mid_epoch_checkpoint_file_sees_the_batches_of_an_uninterrupted_run(
    tmp_path: Path, tokenizer: Any
) -> None:
    full = fit(tokenizer, tmp_path / "full", max_steps=10).seen
    assert len(full) == 10 and len(set(full)) == 10
    (checkpoint,) = (tmp_path / "full").glob("*step=4.ckpt")
    resumed = fit(tokenizer, tmp_path / "resumed", max_steps=10, ckpt_path=str(checkpoint)).seen
    assert resumed == full[4:]


def test_a_resume_from_a_checkpoint_without_a_data_position_is_warned_of(
    tmp_path: Path, tokenizer: Any
) -> None:
    """A checkpoint saved before the data module was used (its entries taken out here) holds
    no data position: Lightning skipped the module's load, and the resumed fit trained the
    first batches again without a word. The same loader's later epochs are not warned of."""
    from zephon_torch import ZephonWarning

    full = fit(tokenizer, tmp_path / "full", max_steps=6).seen
    (checkpoint,) = (tmp_path / "full").glob("*step=4.ckpt")
    saved = torch.load(checkpoint, weights_only=False)
    del saved["PipelineDataModule"], saved["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    torch.save(saved, tmp_path / "bare.ckpt")
    said = r"resumes at global step 4 from a checkpoint that holds no data position"
    with pytest.warns(ZephonWarning, match=said):
        assert fit(tokenizer, tmp_path / "bare", 6, str(tmp_path / "bare.ckpt")).seen == full[:2]
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "the fit resumes")
        assert fit(tokenizer, tmp_path / "resumed", 6, str(checkpoint)).seen == full[4:]
        data = PipelineDataModule(small_pipeline(tokenizer, lanes=2, exhaustion="repeat"))
        epochs = trainer(tmp_path / "epochs", 1000, max_epochs=3, limit_train_batches=2)
        epochs.fit(TinyLM(), datamodule=data)


def test_a_mid_step_checkpoint_resumes_without_the_loaders_mid_step_warning(
    tmp_path: Path, tokenizer: Any
) -> None:
    """Lightning counts the begun step's micro-batches itself; its own restore of the loader's
    state (after the module's) warned that a loop counting 2 a step from there was off by 1."""
    full = fit(tokenizer, tmp_path / "full", max_steps=6, every=3).seen  # 2 lanes, 1 a step
    (checkpoint,) = (tmp_path / "full").glob("*step=3.ckpt")  # lane 0 of turn 1 done
    with warnings.catch_warnings():
        warnings.filterwarnings("error", "this state was saved mid-step")
        assert fit(tokenizer, tmp_path / "resumed", 6, str(checkpoint), every=3).seen == full[3:]


def test_a_checkpoint_before_every_lane_was_used_resumes_exactly(
    tmp_path: Path, tokenizer: Any
) -> None:
    """Lightning fetches one batch ahead; with more lanes than steps at the checkpoint, the
    fetched lane was saved as used (without workers), so the resumed run skipped its batch."""
    full = fit(tokenizer, tmp_path / "full", max_steps=6, lanes=4, every=2).seen
    (checkpoint,) = (tmp_path / "full").glob("*step=2.ckpt")
    resumed = fit(tokenizer, tmp_path / "resumed", 6, str(checkpoint), lanes=4, every=2).seen
    assert resumed == full[2:]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_loader_built_again_every_epoch_continues_the_stream(
    tmp_path: Path, tokenizer: Any, num_workers: int
) -> None:
    """``reload_dataloaders_every_n_epochs=1``: with workers, each new loader started at step
    0 again (the main process's pipeline never moved), so every epoch trained on the first
    batches."""
    pipeline = small_pipeline(tokenizer, lanes=2, exhaustion="repeat", datasets=DATASETS)
    expected = [
        hashlib.sha256(b.to_training()["input_ids"].numpy().tobytes()).hexdigest()
        for _, b in zip(range(9), pipeline)
    ]
    torch.manual_seed(0)
    model = TinyLM()
    data = PipelineDataModule(
        small_pipeline(tokenizer, lanes=2, exhaustion="repeat", datasets=DATASETS),
        num_workers=num_workers,
    )
    L.Trainer(
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
        max_epochs=3,
        limit_train_batches=3,
        reload_dataloaders_every_n_epochs=1,
    ).fit(model, datamodule=data)
    assert model.seen == expected


class ValidatedLM(TinyLM):
    """Records each validation run's batches, a run per list."""

    def __init__(self) -> None:
        super().__init__()
        self.validations: list[list[str]] = []

    def on_validation_epoch_start(self) -> None:
        self.validations.append([])

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        assert "zephon" not in batch  # delivered as it came: nothing left to mark
        self.validations[-1].append(
            hashlib.sha256(batch["input_ids"].numpy().tobytes()).hexdigest()
        )


def _hashes(pipeline: Any) -> list[str]:
    return [
        hashlib.sha256(b.to_training()["input_ids"].numpy().tobytes()).hexdigest() for b in pipeline
    ]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_every_validation_run_sees_the_validation_batches_from_the_start(
    tmp_path: Path, tokenizer: Any, num_workers: int
) -> None:
    """Without `val_pipeline` there was no validation, and a zephon loader made once by hand
    showed each run other batches (it goes on where it stopped). Validation leaves the
    training batches and their resume as they were."""
    val_data = two_sources(12, 10, shard_size=4)
    whole = _hashes(small_pipeline(tokenizer, lanes=2, datasets=val_data))
    assert len(whole) >= 4

    def run(root: Path, ckpt_path: str | None = None, validate: bool = True) -> ValidatedLM:
        torch.manual_seed(0)
        model = ValidatedLM()
        data = PipelineDataModule(
            small_pipeline(tokenizer, lanes=2, exhaustion="repeat", datasets=DATASETS),
            val_pipeline=small_pipeline(tokenizer, lanes=2, datasets=val_data)
            if validate
            else None,
            num_workers=num_workers,
        )
        trainer(root, 4, max_steps=9, val_check_interval=3, num_sanity_val_steps=2).fit(
            model, datamodule=data, ckpt_path=ckpt_path
        )
        return model

    full = run(tmp_path / "full")
    assert full.validations == [whole[:2], whole, whole, whole]  # sanity check, steps 3, 6, 9
    assert full.seen == run(tmp_path / "plain", validate=False).seen  # training untouched
    (checkpoint,) = (tmp_path / "full").glob("*step=4.ckpt")
    resumed = run(tmp_path / "resumed", str(checkpoint))
    assert resumed.seen == full.seen[4:]
    assert resumed.validations[-2:] == [whole, whole]


def test_a_validation_pipeline_that_never_ends_needs_a_batch_limit(
    tmp_path: Path, tokenizer: Any
) -> None:
    """With exhaustion='repeat' and no limit_val_batches, the first validation run went on for
    ever (77,000 batches when a review killed it)."""
    from zephon_torch import ConfigError

    def data() -> PipelineDataModule:
        return PipelineDataModule(
            small_pipeline(tokenizer, lanes=2, exhaustion="repeat", datasets=DATASETS),
            val_pipeline=small_pipeline(tokenizer, lanes=2, exhaustion="repeat", datasets=DATASETS),
        )

    with pytest.raises(ConfigError, match="`val_pipeline` never ends"):
        trainer(tmp_path / "a", 4, max_steps=2, val_check_interval=2).fit(
            ValidatedLM(), datamodule=data()
        )
    model = ValidatedLM()
    limited = trainer(tmp_path / "b", 4, max_steps=4, val_check_interval=2, limit_val_batches=3)
    limited.fit(model, datamodule=data())
    assert [len(run) for run in model.validations] == [2, 3, 3]  # the sanity check, steps 2, 4
    assert model.validations[1] == model.validations[2]


@pytest.mark.parametrize(
    ("given", "named"),
    [
        ({"pipeline": "data/train"}, "`pipeline` must be a zephon_torch Pipeline"),
        ({"val_pipeline": [1]}, "`val_pipeline` must be a zephon_torch Pipeline"),
        ({"num_workers": -1}, "`num_workers` must be >= 0"),
        ({"num_workers": 2.0}, "`num_workers`"),
        ({"pin_memory": "yes"}, "`pin_memory`"),
        ({"attention_mask": 1}, "`attention_mask`"),
        ({"multiprocessing_context": "spwan", "num_workers": 2}, "`multiprocessing_context`"),
        ({"multiprocessing_context": 3}, "`multiprocessing_context` must be one of"),
    ],
)
def test_a_data_module_refuses_bad_arguments_when_made(
    tokenizer: Any, given: dict[str, Any], named: str
) -> None:
    """They were found only when Lightning first asked for a loader, after the model's set-up
    and the sanity check's start."""
    from zephon_torch import ConfigError

    arguments: dict[str, Any] = {"pipeline": small_pipeline(tokenizer)} | given
    with pytest.raises(ConfigError, match=re.escape(named)):
        PipelineDataModule(**arguments)


def test_importing_zephon_torch_does_not_import_lightning() -> None:
    import subprocess
    import sys

    code = "import sys, zephon_torch, zephon_torch.torch; print('lightning' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_data_module_ships_in_the_package(tmp_path: Path) -> None:
    """Importable from anywhere, not only from a source checkout's root."""
    import subprocess
    import sys

    code = "import zephon_torch.lightning as m; print(m.PipelineDataModule.__name__)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert out.stdout.strip() == "PipelineDataModule"


class IndexDataset(Dataset[int]):
    """Each sample is its own index; at module level, so spawned processes can unpickle it."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> int:
        return index


def _fabric_run(fabric: Any, out: str) -> None:
    dataset = IndexDataset()
    s = ElasticDistributedSampler(dataset, global_batch_size=8, seed=1)
    own = [batch.tolist() for batch in DataLoader(dataset, batch_size=4, sampler=s)]
    loader = fabric.setup_dataloaders(DataLoader(dataset, batch_size=4, sampler=s))
    seen = [batch.tolist() for batch in loader]
    Path(out, f"{fabric.global_rank}.json").write_text(json.dumps([own, seen]))


@pytest.mark.slow
def test_lightning_fabric_ddp_keeps_the_elastic_split(tmp_path: Path) -> None:
    """Fabric (as the Trainer) wraps any sampler that is not a DistributedSampler in one that
    splits each rank's share again: half the data of an epoch was lost, reshuffled."""
    from functools import partial

    from lightning.fabric import Fabric

    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp_spawn")
    fabric.launch(partial(_fabric_run, out=str(tmp_path)))
    for rank in range(2):
        own, seen = json.loads((tmp_path / f"{rank}.json").read_text())
        assert len(own) == 4  # 32 samples, G = 8: four steps of 4 per rank
        assert seen == own


class IndexModel(L.LightningModule):
    """Records the indices of each batch it trains on."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Linear(1, 1)
        self.seen: list[list[int]] = []

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        self.seen.append(batch.tolist())
        return self.weight(batch.float()[:, None]).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_mid_epoch_resume_with_the_elastic_sampler_trains_the_rest_of_every_epoch(
    tmp_path: Path,
) -> None:
    """Trainer + StatefulDataLoader + ElasticDistributedSampler, 2 epochs of 8 steps, resumed
    from step 3: the sampler's len shrank to the rest of the epoch after the load, and
    Lightning, which restores its own progress, ended the resumed epoch after 2 steps and
    every later epoch after 5 (7 batches instead of 13)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    def fit(root: Path, ckpt_path: str | None = None) -> list[list[int]]:
        dataset = IndexDataset()
        sampler = ElasticDistributedSampler(dataset, global_batch_size=4, num_replicas=1, rank=0)
        model = IndexModel()
        loader = StatefulDataLoader(dataset, batch_size=4, sampler=sampler)
        trainer(root, 3, max_epochs=2).fit(model, train_dataloaders=loader, ckpt_path=ckpt_path)
        return model.seen

    full = fit(tmp_path / "full")
    assert len(full) == 16
    (checkpoint,) = (tmp_path / "full").glob("*step=3.ckpt")
    assert fit(tmp_path / "resumed", str(checkpoint)) == full[3:]


def test_a_checkpoint_taken_mid_step_on_several_ranks_is_warned_of(tokenizer: Any) -> None:
    """It resumes on its own world size only, and nothing said so when it was saved."""
    pipeline = small_pipeline(tokenizer, lanes=4, world_size=2, rank=0, exhaustion="repeat")
    module = PipelineDataModule(pipeline)
    batches = iter(module.train_dataloader())
    module.on_before_batch_transfer(next(batches), 0)  # lane 0 of the rank's lanes 0 and 1
    with pytest.warns(UserWarning, match=r"mid-step .*accumulate_grad_batches=2"):
        module.state_dict()
    # accumulating a step already: Lightning's save after a resume's first micro-batch; the
    # advice to set accumulate_grad_batches=2 told such a fit to do what it did
    module.trainer = SimpleNamespace(accumulate_grad_batches=2)  # type: ignore[assignment]
    with pytest.warns(UserWarning, match=r"mid-step .*saves again after the first micro-batch"):
        module.state_dict()
    module.trainer = None
    module.on_before_batch_transfer(next(batches), 0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module.state_dict()  # at a step end


@on_measured_text
def test_a_checkpoint_taken_mid_step_where_a_spent_lane_is_ahead_is_warned_of(
    tokenizer: Any,
) -> None:
    """Spent lanes were left out of the turns compared: the rank's lanes at turns 8 (spent)
    and 7 read as one step, a checkpoint that is refused on another world size."""
    datasets = two_sources(12, 9, shard_size=8)
    pipeline = small_pipeline(tokenizer, lanes=4, world_size=2, rank=0, datasets=datasets)
    module = PipelineDataModule(pipeline)
    batches = iter(module.train_dataloader())
    for _ in range(2 * 7 + 1):  # seven steps and lane 0 of the eighth
        module.on_before_batch_transfer(next(batches), 0)
    with pytest.warns(UserWarning, match=r"mid-step \(this rank's lanes are at turns \[7, 8\]"):
        state = module.state_dict()["zephon"]
    assert {k: (s["turn"], s["done"]) for k, s in state["lanes"].items()} == {
        "0": (8, True),
        "1": (7, False),
    }


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_resume_from_every_step_of_two_epochs_trains_the_rest_with_any_worker_count(
    tmp_path: Path, num_workers: int
) -> None:
    """The checkpoint at epoch 0's last step holds the sampler at that epoch's end. Lightning
    makes the resumed loader's iterator before its set_epoch(1); with workers that iterator drew
    at once from the finished epoch, found nothing, and epoch 1 trained no batch."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    def fit(root: Path, ckpt_path: str | None = None) -> list[list[int]]:
        dataset = IndexDataset()  # 32 samples, G = 16: two steps per epoch
        sampler = ElasticDistributedSampler(dataset, global_batch_size=16, num_replicas=1, rank=0)
        model = IndexModel()
        loader = StatefulDataLoader(
            dataset, batch_size=16, sampler=sampler, num_workers=num_workers
        )
        trainer(root, 1, max_epochs=2).fit(model, train_dataloaders=loader, ckpt_path=ckpt_path)
        return model.seen

    full = fit(tmp_path / "full")
    assert len(full) == 4 and full[:2] != full[2:]
    for step in range(1, 4):
        (checkpoint,) = (tmp_path / "full").glob(f"*step={step}.ckpt")
        assert fit(tmp_path / f"resumed{step}", str(checkpoint)) == full[step:], step


class _Counting(TinyLM):
    def __init__(self) -> None:
        super().__init__()
        self.batches = 0

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self.batches += 1
        return super().training_step(batch, batch_idx)


def test_a_fit_past_the_end_of_a_finite_stream_stops_where_the_data_ends(
    tmp_path: Path, tokenizer: Any
) -> None:
    """With exhaustion="stop", max_steps past the data and no max_epochs, Lightning started
    empty epochs for ever (under DDP with workers, new workers for each) (review I, F2)."""
    pipeline = small_pipeline(tokenizer, lanes=2, exhaustion="stop", datasets=DATASETS)
    expected = sum(1 for _ in zephon_loader(pipeline))
    model = _Counting()
    fitting = trainer(tmp_path, every=1000, max_steps=10_000, max_epochs=50)  # 50: no hang
    with pytest.warns(UserWarning, match=r"the training data is spent at global step \d+"):
        fitting.fit(model, datamodule=PipelineDataModule(pipeline))
    assert model.batches == expected > 0
    assert fitting.current_epoch <= 2


def zephon_loader(pipeline: Any) -> Any:
    from zephon_torch.torch import DataLoader as ZephonLoader

    return ZephonLoader(pipeline)


def test_a_loader_says_it_has_no_length() -> None:
    from zephon_torch.torch import DataLoader as ZephonLoader

    loader = ZephonLoader(_tiny_pipeline())
    with pytest.raises(TypeError, match=r"streams micro-batches and has no length"):
        len(loader)


def _tiny_pipeline() -> Any:
    from zephon_torch import Pipeline
    from zephon_torch.io import Dataset
    from zephon_torch.work import StaticMixtureWorkSource

    dataset = Dataset.from_dict("ids", {"ids": [[1, 2, 3]] * 4})
    return Pipeline(StaticMixtureWorkSource([dataset])).pretokenized("ids").pack_flat(4).batch(1)


def test_the_data_module_moves_batches_as_to_device_does(tokenizer: Any) -> None:
    """Lightning's own transfer moved max_seqlen to the accelerator too, where each attention
    layer's int() of it waits for the GPU (the meta device stands in for one)."""
    data = PipelineDataModule(small_pipeline(tokenizer, lanes=2, exhaustion="repeat"))
    item = next(iter(data.train_dataloader()))
    moved = data.transfer_batch_to_device(item, torch.device("meta"), 0)
    assert moved["max_seqlen"].device.type == "cpu"
    assert moved["input_ids"].device.type == "meta" and moved["labels"].device.type == "meta"
    assert data.transfer_batch_to_device([item["input_ids"]], torch.device("meta"), 0)[0].is_meta


def test_the_data_module_hands_out_the_masks_asked_for(tokenizer: Any) -> None:
    """`to_training`'s two flags had no way through the data module: a Lightning model with
    sdpa could get no attention mask, and labels crossed documents' ends."""
    pipeline = small_pipeline(tokenizer, lanes=2, exhaustion="repeat")
    flags = {"mask_document_boundaries": True, "attention_mask": True}
    validation = small_pipeline(tokenizer, lanes=2, exhaustion="stop")
    data = PipelineDataModule(pipeline, val_pipeline=validation, **flags)
    loaders = [data.train_dataloader(), data.val_dataloader()]
    expected = next(iter(pipeline)).to_training(**flags)
    for item in (next(iter(loader)) for loader in loaders):
        assert item["attention_mask"].shape == expected["attention_mask"].shape
        assert torch.equal(item["attention_mask"], expected["attention_mask"])
        assert torch.equal(item["labels"], expected["labels"])
    plain = next(iter(PipelineDataModule(pipeline).train_dataloader()))
    assert "attention_mask" not in plain and not torch.equal(plain["labels"], expected["labels"])


def test_a_warning_during_fit_points_at_the_fit_line(tokenizer: Any, tmp_path: Path) -> None:
    """Lightning's loops stand between the user's `fit` and the loader: walked through, as
    torch's and torchdata's loader code is, to the user's line (it pointed at Lightning's)."""
    import sys

    sources = two_sources(40, 30, shard_size=3)  # one runs out well before the other
    data = PipelineDataModule(small_pipeline(tokenizer, exhaustion="stop", datasets=sources))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        trainer(tmp_path, 1000, max_steps=1000).fit(TinyLM(), datamodule=data)
    said = [w for w in caught if "ran out" in str(w.message)]
    assert said and {(w.filename, w.lineno) for w in said} == {(__file__, line)}


def test_lanes_asked_for_before_a_lightning_ddp_fit_say_why_they_cannot_be_told(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lightning's DDP launcher sets WORLD_SIZE and LOCAL_RANK, not RANK, in the processes it
    starts: `len(pipeline.lanes)` before the fit (for accumulate_grad_batches) was refused as
    an environment that 'sets only one of WORLD_SIZE and RANK', which no user line set."""
    from zephon_torch import ConfigError

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.delenv("RANK", raising=False)
    said = r"set both or neither \(a launcher such as Lightning's DDP .* // devices\)$"
    with pytest.raises(ConfigError, match=said):
        _ = small_pipeline(tokenizer, lanes=4).lanes
