"""A streamed fine-tune end to end: the tiny recipe pointed at local webdataset shards written from the digits
images (`streaming: true`, 2 dataloader workers), and a run resumed from its middle checkpoint, which must end
bit for bit where the uninterrupted run ends (the stream skips the trained batches itself)."""

import json
import shutil
from pathlib import Path

import pytest

from vit_ft.data.digits import write_digits_imagefolder

from ..cli_runner import run_script
from ..conftest import write_tiny_recipe
from ..fake_hub import tar_shard

FINETUNE = "scripts/finetune.py"
TRAIN_SHARDS = (30, 11, 22, 7, 26)  # unequal, and 5 shards for 2 workers: not an even split


def write_digit_shards(tmp: Path) -> Path:
    """train-*.tar (5 shards of unequal length) and validation-00000.tar from the digits images."""
    write_digits_imagefolder(tmp / "digits")
    def samples(folder: Path) -> list[tuple[str, dict[str, bytes]]]:
        files = sorted(folder.glob("*/*.png"))
        return [(f"{p.parent.name}_{p.stem}", {"png": p.read_bytes(), "cls": p.parent.name.encode()}) for p in files]

    train, validation = samples(tmp / "digits" / "train"), samples(tmp / "digits" / "test")
    shards = tmp / "shards"
    shards.mkdir()
    start = 0
    for index, size in enumerate(TRAIN_SHARDS):
        (shards / f"train-{index:05d}.tar").write_bytes(tar_shard(train[start : start + size]))
        start += size
    (shards / "validation-00000.tar").write_bytes(tar_shard(validation[::8]))
    return shards


def streamed_recipe(tmp: Path, **overrides) -> Path:
    shards = write_digit_shards(tmp)
    values = {
        "dataset_name": str(shards), "train_dir": None, "test_dir": None, "streaming": True,
        "image_column": "png", "label_column": "cls", "class_names": [str(i) for i in range(10)],
        "max_train_samples": None, "max_steps": 6, "save_strategy": "steps", "save_steps": 3,
        "save_total_limit": None, "eval_strategy": "no", "per_device_train_batch_size": 8,
        "dataloader_num_workers": 2, "hidden_dropout_prob": 0.1, "crop_scale_min": 0.5,
    }  # fmt: skip
    return write_tiny_recipe(tmp, **{**values, **overrides})


def final_run(out: Path) -> dict:
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    return {
        "losses": {e["step"]: (e["loss"], e["grad_norm"]) for e in history if "loss" in e},
        "weights": (out / "model.safetensors").read_bytes(),
    }


@pytest.fixture(scope="module")
def streamed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("streamed")
    recipe = streamed_recipe(tmp)
    result = run_script(FINETUNE, ["--recipe", recipe], None, cwd=tmp)
    assert result.returncode == 0, result.stderr[-4000:]
    return tmp, recipe


def test_streamed_webdataset_fine_tunes(streamed):
    tmp, _ = streamed
    out = tmp / "out"
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 6
    labels = json.loads((out / "labels.json").read_text())
    assert labels["label2id"] == {str(i): i for i in range(10)}
    metrics = json.loads((out / "eval_results.json").read_text())
    assert 0.0 <= metrics["eval_accuracy"] <= 1.0


def test_resumed_stream_ends_where_the_uninterrupted_one_ends(streamed, capfd):
    tmp, recipe = streamed
    killed = tmp / "killed"
    killed.mkdir()
    shutil.copytree(tmp / "out" / "checkpoint-3", killed / "out" / "checkpoint-3")  # as a run killed after it
    result = run_script(FINETUNE, ["--recipe", recipe, "--output_dir", str(killed / "out"), "--resume"],
                        capfd, cwd=tmp)  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    resumed, uninterrupted = final_run(killed / "out"), final_run(tmp / "out")
    assert resumed["losses"] == uninterrupted["losses"]
    assert resumed["weights"] == uninterrupted["weights"]
