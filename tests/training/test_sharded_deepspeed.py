"""DeepSpeed ZeRO-2 on two CPU processes (gloo, DeepSpeed's CPU accelerator): the shipped
recipes/accelerate_configs/deepspeed_zero2.yaml trains the tiny recipe with EMA on, saves, resumes from the
middle checkpoint to the uninterrupted run's end and saves the final model as model.safetensors. Skipped where
deepspeed is not installed (it is not a dependency of vit_ft). The launcher shim is test_sharded.py's."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file

from ..conftest import logged_losses, write_tiny_recipe
from .test_sharded import RESUME_AT, SETTINGS, STEPS, assert_ema_recomputed, launch, reports

pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install deepspeed)")
# two launches of two processes, about 75 s together (and DeepSpeed's first build of its CPU ops, about 2 min)
pytestmark = pytest.mark.long  # DeepSpeed's build (~2 min) and a launch: CI's own step after the suite

DEEPSPEED_ON_CPU = {"DS_ACCELERATOR": "cpu"}


@pytest.fixture(scope="module")
def zero2_run(tmp_path_factory):
    """A 6-step ZeRO-2 run, and the same run resumed from checkpoint-3 alone in another folder."""
    tmp = tmp_path_factory.mktemp("zero2")
    recipe = write_tiny_recipe(tmp, **SETTINGS)
    launch(tmp, "deepspeed_zero2.yaml", recipe, tmp / "report", env=DEEPSPEED_ON_CPU)
    resumed = tmp / "resumed"
    resumed.mkdir()
    shutil.copytree(tmp / "out" / f"checkpoint-{RESUME_AT}", resumed / f"checkpoint-{RESUME_AT}")
    launch(tmp, "deepspeed_zero2.yaml", recipe, tmp / "report-resumed", "--output_dir", str(resumed), "--resume",
           env=DEEPSPEED_ON_CPU)  # fmt: skip
    return tmp


def test_both_launches_trained_with_zero2(zero2_run):
    for folder in (zero2_run / "report", zero2_run / "report-resumed"):
        for rank, report in enumerate(reports(folder)):
            assert report["rank"] == rank and report["world_size"] == 2
            assert report["distributed_type"] == "DEEPSPEED" and report["zero_stage"] == 2
            # ZeRO-2 partitions the optimizer state: each process holds its part, not the whole
            assert 0 < report["optimizer_elements"] < report["elements"]
            assert report["ema"] == {"tensors": report["parameters"], "dtensor": False, "dtypes": ["torch.float32"]}
        assert sum(r["optimizer_elements"] for r in reports(folder)) >= reports(folder)[0]["elements"]


def test_deepspeed_checkpoints_are_complete_and_guarded(zero2_run, tmp_path):
    from vit_ft.training.checkpoints import checkpoint_problem, write_checkpoint_record

    for step in range(1, STEPS + 1):
        checkpoint = zero2_run / "out" / f"checkpoint-{step}"
        assert (checkpoint / f"global_step{step}" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").is_file()
        assert checkpoint_problem(checkpoint) is None
    copy = tmp_path / "checkpoint-6"
    shutil.copytree(zero2_run / "out" / "checkpoint-6", copy)
    # ZeRO-3 without gathering the weights at save writes no model.safetensors: global_step6/ is the model state
    (copy / "model.safetensors").unlink()
    write_checkpoint_record(copy, "zero3", 6)
    assert checkpoint_problem(copy) is None
    part = copy / "global_step6" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    part.write_bytes(part.read_bytes()[:-100])  # process 1's part cut short
    assert "its global_step6/zero_pp_rank_1_mp_rank_00_optim_states.pt is not the file" in checkpoint_problem(copy)
    shutil.rmtree(copy / "global_step6")
    assert "no model state" in checkpoint_problem(copy)


def test_the_zero2_resume_ends_as_the_uninterrupted_run(zero2_run):
    out, resumed = zero2_run / "out", zero2_run / "resumed"
    assert sorted(int(p.name.split("-")[1]) for p in resumed.glob("checkpoint-*")) == [3, 4, 5, 6]

    assert logged_losses(resumed) == logged_losses(out) and len(logged_losses(out)) == STEPS
    final, again = load_file(out / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert set(final) == set(again) and all(torch.equal(final[k], again[k]) for k in final)
    last = f"checkpoint-{STEPS}/ema.safetensors"
    assert (resumed / last).read_bytes() == (out / last).read_bytes()


def test_the_zero2_ema_is_the_float32_average_of_the_weights(zero2_run):
    assert_ema_recomputed(zero2_run / "out", lambda checkpoint: load_file(checkpoint / "model.safetensors"))
