"""Sharded training (FSDP2) on two CPU processes: the shipped recipes/accelerate_configs/fsdp.yaml trains a tiny
recipe with EMA on, saves sharded checkpoints, resumes from the middle one to the uninterrupted run's end bit for
bit, and exports the final model consolidated as model.safetensors.

accelerate 1.15 selects FSDP only beside a GPU-like distributed type: with `use_cpu` it stays MULTI_CPU (plain
DDP over gloo); and it starts DeepSpeed only without `use_cpu`, where a machine without GPUs has no backend.
Run as `python -m tests.training.test_sharded ...` (what the launches here and in test_sharded_deepspeed.py do),
this module is a launcher shim that lets it select FSDP on the CPU as it would on GPUs (the same
FullyShardedDataParallelPlugin from the config; torch's `fully_shard` then shards the parameters over gloo), or
start DeepSpeed over gloo, and makes each process report, at its first training step, what it trains with. Each
test asserts from those reports that sharding happened: a launch that fell back to DDP fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from ..conftest import REPO, logged_losses, write_tiny_recipe

STEPS, RESUME_AT, EMA_DECAY = 6, 3, 0.5
# 96 images, 16 per process, 2 processes: 3 steps an epoch; a sharded checkpoint (and its EMA) at every step,
# dropout and random crops drawn in each process; the final model is the last step's
SETTINGS = {
    "num_train_epochs": 2,
    "save_strategy": "steps",
    "save_steps": 1,
    "save_total_limit": None,
    "load_best_model_at_end": False,
    "hidden_dropout_prob": 0.1,
    "crop_scale_min": 0.5,
    "ema_decay": EMA_DECAY,
}
REPORT = "VIT_FT_TEST_SHARDING_REPORT"  # where each launched process writes what it trains with


def launch(tmp: Path, config: str, recipe: Path, report: Path, *args: str, env: dict | None = None) -> str:
    """The shipped accelerate `config` (fsdp.yaml, deepspeed_zero2.yaml) on two processes, through this shim."""
    values = yaml.safe_load((REPO / "recipes" / "accelerate_configs" / config).read_text())
    path = tmp / f"2proc-{config}"
    path.write_text(yaml.safe_dump({**values, "num_processes": 2}))
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(path),
        "-m", "tests.training.test_sharded", "--recipe", str(recipe), *args,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), REPORT: str(report), "OMP_NUM_THREADS": "1", **(env or {})}
    result = subprocess.run(command, cwd=tmp, capture_output=True, text=True, timeout=600, env=env)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-4000:]
    return log


def launch_fsdp(tmp: Path, recipe: Path, report: Path, *args: str) -> str:
    return launch(tmp, "fsdp.yaml", recipe, report, "--use_cpu", "true", *args)


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory):
    """A 6-step FSDP2 run whose final model is the EMA, and the same run resumed from checkpoint-3 alone in another
    folder."""
    tmp = tmp_path_factory.mktemp("sharded")
    recipe = write_tiny_recipe(tmp, **SETTINGS, ema_as_final_model=True)
    launch_fsdp(tmp, recipe, tmp / "report")
    resumed = tmp / "resumed"
    resumed.mkdir()
    shutil.copytree(tmp / "out" / f"checkpoint-{RESUME_AT}", resumed / f"checkpoint-{RESUME_AT}")
    launch_fsdp(tmp, recipe, tmp / "report-resumed", "--output_dir", str(resumed), "--resume")
    return tmp, recipe


def reports(folder: Path) -> list[dict]:
    return [json.loads((folder / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def sharded_weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    """The model's whole tensors from a checkpoint's FSDP shards, read in this one process."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    whole = checkpoint / "whole.pt"
    dcp_to_torch_save(checkpoint / "pytorch_model_fsdp_0", whole)
    state = torch.load(whole, weights_only=True)["model"]
    whole.unlink()
    return state


@pytest.mark.long  # the module's two launches of two processes, about 70 s together: CI's own step
def test_both_launches_trained_sharded(sharded_run):
    tmp, _ = sharded_run
    for folder in (tmp / "report", tmp / "report-resumed"):
        for rank, report in enumerate(reports(folder)):
            assert report["rank"] == rank and report["world_size"] == 2
            assert report["distributed_type"] == "FSDP"
            assert report["parameters"] > 0 and report["dtensor_parameters"] == report["parameters"]
            # each process holds a shard: together, not each, the whole model
            assert 0 < report["local_elements"] < report["elements"]
            assert report["ema"] == {"tensors": report["parameters"], "dtensor": True, "dtypes": ["torch.float32"]}
        assert sum(r["local_elements"] for r in reports(folder)) >= reports(folder)[0]["elements"]


@pytest.mark.long
def test_sharded_checkpoints_are_complete_and_guarded(sharded_run, tmp_path):
    from vit_ft.training.checkpoints import CHECKPOINT_RECORD, checkpoint_problem

    tmp, _ = sharded_run
    for step in range(1, STEPS + 1):
        checkpoint = tmp / "out" / f"checkpoint-{step}"
        assert not (checkpoint / "model.safetensors").exists()  # the model is in shards, one per process
        assert {p.name for p in (checkpoint / "pytorch_model_fsdp_0").iterdir()} == {
            ".metadata", "__0_0.distcp", "__1_0.distcp"
        }
        assert checkpoint_problem(checkpoint) is None
        recorded = json.loads((checkpoint / CHECKPOINT_RECORD).read_text())["files"]
        assert {"pytorch_model_fsdp_0/__1_0.distcp", "optimizer_0/__1_0.distcp", "ema.safetensors"} <= set(recorded)
    copy = tmp_path / "checkpoint-6"
    shutil.copytree(tmp / "out" / "checkpoint-6", copy)
    shard = copy / "pytorch_model_fsdp_0" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-100])  # process 1's shard cut short
    assert "its pytorch_model_fsdp_0/__1_0.distcp is not the file" in checkpoint_problem(copy)
    (copy / "pytorch_model_fsdp_0" / ".metadata").unlink()  # the coordinator died before its .metadata
    assert "no model state" in checkpoint_problem(copy)


@pytest.mark.long
def test_the_resume_ends_as_the_uninterrupted_run(sharded_run):
    tmp, _ = sharded_run
    out, resumed = tmp / "out", tmp / "resumed"
    # it went on from checkpoint-3 (a run started over would have written checkpoint-1 and 2 again)
    assert sorted(int(p.name.split("-")[1]) for p in resumed.glob("checkpoint-*")) == [3, 4, 5, 6]

    assert logged_losses(resumed) == logged_losses(out) and len(logged_losses(out)) == STEPS
    for name in ("eval_results.json", "test_results.json"):
        a, b = (json.loads((f / name).read_text()) for f in (out, resumed))
        assert {k: v for k, v in a.items() if "runtime" not in k and "per_second" not in k} == {
            k: v for k, v in b.items() if "runtime" not in k and "per_second" not in k
        }
    assert (resumed / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()
    last = f"checkpoint-{STEPS}/ema.safetensors"
    assert (resumed / last).read_bytes() == (out / last).read_bytes()


def assert_ema_recomputed(out: Path, weights_at: Callable[[Path], dict[str, torch.Tensor]]) -> None:
    """Each checkpoint's ema.safetensors is, in float32, the average recomputed here from every step's weights
    (`weights_at(checkpoint)`): ema_1 = w_1, ema_s = lerp(ema_(s-1), w_s, 1 - decay)."""
    from vit_ft.training.ema import ema_decay_at

    expected: dict[str, torch.Tensor] = {}
    for step in range(1, STEPS + 1):
        checkpoint = out / f"checkpoint-{step}"
        weights = weights_at(checkpoint)
        weight = 1 - ema_decay_at(step, EMA_DECAY)
        expected = {
            name: expected[name].lerp(value.float(), weight) if expected else value.float().clone()
            for name, value in weights.items()
        }
        ema = load_file(checkpoint / "ema.safetensors")
        assert set(ema) == set(expected) and {v.dtype for v in ema.values()} == {torch.float32}
        for name, value in ema.items():
            torch.testing.assert_close(value, expected[name], rtol=1e-6, atol=1e-7)
    moved = [name for name, value in weights.items() if not torch.equal(value.float(), expected[name])]
    assert moved  # the average is not the weights: the test can tell them apart


@pytest.mark.long
def test_the_ema_is_the_float32_average_of_the_sharded_weights(sharded_run):
    tmp, _ = sharded_run
    assert_ema_recomputed(tmp / "out", sharded_weights)


@pytest.mark.long
def test_the_final_model_is_consolidated_and_loads_in_a_clean_process(sharded_run):
    """The EMA copied into the sharded parameters at the end, then gathered into one model.safetensors."""
    tmp, _ = sharded_run
    out = tmp / "out"
    final = load_file(out / "model.safetensors")
    ema = load_file(out / f"checkpoint-{STEPS}" / "ema.safetensors")  # its own gather, checked against the shards
    last = sharded_weights(out / f"checkpoint-{STEPS}")
    assert set(final) == set(ema) == set(last)
    assert all(torch.equal(final[name], ema[name]) for name in final)
    assert any(not torch.equal(final[name], last[name]) for name in final)  # the EMA, not the last weights
    # the model's own code beside it, not torch's FSDP files (fully_shard's subclass lives in those)
    assert (out / "modeling_vit_ft.py").is_file() and not list(out.glob("_fsdp*.py"))
    script = (
        "import sys, torch\n"
        "from safetensors.torch import load_file\n"
        "from transformers import AutoModelForImageClassification\n"
        "model = AutoModelForImageClassification.from_pretrained(sys.argv[1], trust_remote_code=True)\n"
        "assert 'vit_ft' not in sys.modules, 'loaded through the installed package, not the folder'\n"
        "saved = load_file(sys.argv[1] + '/model.safetensors')\n"
        "state = model.state_dict()\n"
        "assert all(torch.equal(state[k], v) for k, v in saved.items()), 'weights differ'\n"
        "print(type(model).__name__, model(torch.zeros(1, 3, 32, 32)).logits.shape[-1])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(out)], capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": "", "OMP_NUM_THREADS": "1"}, cwd=tmp,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["ViTFTForImageClassification", "10"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_ema_of_low_precision_weights_is_kept_in_float32(tmp_path, dtype):
    """bf16 weights (DeepSpeed's with bf16): a step of 1/128 times (1 - 0.999) is below bf16's resolution at 1."""
    from vit_ft.training.ema import WeightEMA

    model = torch.nn.Linear(4, 2).to(dtype)
    torch.nn.init.ones_(model.weight)
    ema = WeightEMA(model, decay=0.999)
    ema.update(model, 1)  # the first update: the average is the weights
    expected = torch.ones(2, 4, dtype=torch.float64)
    for step in range(2, 12):
        with torch.no_grad():
            model.weight.add_(1 / 128)
        ema.update(model, step)
        expected += (1 - 0.999) * (model.weight.double() - expected)
    assert {v.dtype for v in ema.shadow.values()} == {torch.float32}
    torch.testing.assert_close(ema.shadow["weight"].double(), expected, rtol=0, atol=1e-6)
    assert ema.shadow["weight"][0, 0] > 1  # moved: in bf16 each update would round back to 1
    ema.save(tmp_path / "ema.safetensors")
    again = WeightEMA(model, decay=0.999)
    again.load(tmp_path / "ema.safetensors")
    assert torch.equal(again.shadow["weight"], ema.shadow["weight"])
    ema.copy_to(model)
    assert model.weight.dtype == dtype
    torch.testing.assert_close(model.weight, ema.shadow["weight"].to(dtype))


def _fsdp_on_the_cpu() -> None:
    """Let accelerate select FSDP beside MULTI_CPU, as it does beside MULTI_GPU (accelerate/state.py)."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType

    accelerator_state_init = AcceleratorState.__init__

    def init(self, *args, fsdp_plugin=None, **kwargs):
        accelerator_state_init(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = PartialState._shared_state["distributed_type"] = DistributedType.FSDP
            self.fsdp_plugin = fsdp_plugin

    AcceleratorState.__init__ = init


def _deepspeed_on_the_cpu() -> None:
    """Let accelerate start DeepSpeed's gloo backend without a GPU: with no accelerator its backend is none and
    its launch one process each; DeepSpeed's own CPU accelerator (DS_ACCELERATOR=cpu) then runs the engine."""
    from accelerate.state import PartialState
    from accelerate.utils import DistributedType

    prepare_backend = PartialState._prepare_backend

    def prepare(self, cpu=False, sagemaker_dp=False, backend=None):
        backend, kind = prepare_backend(self, cpu, sagemaker_dp, backend)
        deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
        if kind == DistributedType.NO and deepspeed and int(os.environ.get("LOCAL_RANK", -1)) != -1:
            return "gloo", DistributedType.MULTI_CPU  # then DEEPSPEED, as accelerate sets it after the backend
        return backend, kind

    PartialState._prepare_backend = prepare


def _zero_partition(model: torch.nn.Module, distributed_type: str) -> dict:
    """Under DeepSpeed: the ZeRO stage, and the float32 optimizer elements this process holds."""
    if distributed_type != "DEEPSPEED":
        return {}
    partitions = model.optimizer.single_partition_of_fp32_groups
    return {
        "zero_stage": model.zero_optimization_stage(),
        "optimizer_elements": sum(p.numel() for p in partitions),
    }


def _report_at_the_first_step() -> None:
    """Each process writes rank<N>.json into $VIT_FT_TEST_SHARDING_REPORT at its first training step."""
    from torch.distributed.tensor import DTensor

    from vit_ft.training.trainer import FineTuneTrainer

    training_step = FineTuneTrainer.training_step

    def step(self, model, inputs, num_items_in_batch=None):
        folder = Path(os.environ[REPORT])
        path = folder / f"rank{self.args.process_index}.json"
        if not path.exists():
            params = list(model.parameters())
            shadow = list(self.ema.ema.shadow.values()) if self.ema is not None else []
            local = [p.to_local() if isinstance(p, DTensor) else p for p in params]
            report = {
                "rank": self.args.process_index,
                "world_size": self.args.world_size,
                "distributed_type": self.accelerator.distributed_type.name,
                "parameters": len(params),
                "dtensor_parameters": sum(isinstance(p, DTensor) for p in params),
                "elements": sum(p.numel() for p in params),
                "local_elements": sum(p.numel() for p in local),
                **_zero_partition(model, self.accelerator.distributed_type.name),
                "ema": {
                    "tensors": len(shadow),
                    "dtensor": all(isinstance(v, DTensor) for v in shadow),
                    "dtypes": sorted({str(v.dtype) for v in shadow}),
                },
            }
            folder.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(report))
        return training_step(self, model, inputs, num_items_in_batch)

    FineTuneTrainer.training_step = step


if __name__ == "__main__":  # the launcher shim: accelerate launch ... -m tests.training.test_sharded ARGS
    _fsdp_on_the_cpu()
    _deepspeed_on_the_cpu()
    _report_at_the_first_step()
    from vit_ft.commands.finetune import main

    main()
