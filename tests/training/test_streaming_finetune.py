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
    return write_shards(tmp / "shards", train, validation, TRAIN_SHARDS, "tar", tar_shard)


def write_shards(folder: Path, train: list, validation: list, sizes: tuple[int, ...], suffix: str, encode) -> Path:
    """`folder`/train-0000N.SUFFIX, shard N holding the next sizes[N] of `train`, and validation-00000.SUFFIX
    with every 8th of `validation`; `encode` writes a shard's bytes (a tar, a parquet file)."""
    folder.mkdir()
    start = 0
    for index, size in enumerate(sizes):
        (folder / f"train-{index:05d}.{suffix}").write_bytes(encode(train[start : start + size]))
        start += size
    (folder / f"validation-00000.{suffix}").write_bytes(encode(validation[::8]))
    return folder


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


# --- through the fake Hub: the imagenet1k recipe on a stand-in of ILSVRC/imagenet-1k, and dogs streamed ---

IMAGENET_ID = "ILSVRC/imagenet-1k"
IMAGENET_NAMES = [f"n{index:08d}" for index in range(1000)]  # the real schema: a ClassLabel of 1,000 names
IMAGENET_SHARDS = {"train": (7, 5), "validation": (4,)}  # parquet shards of unequal length


def imagenet_files() -> dict[str, bytes]:
    """A stand-in of ILSVRC/imagenet-1k with its schema (image, label: ClassLabel of 1,000 names) and few rows."""
    from ..fake_hub import dataset_card, parquet_bytes
    from ..test_headline import dog_image

    files, sizes = {}, {}
    for split, shards in IMAGENET_SHARDS.items():
        for index, count in enumerate(shards):
            labels = [(37 * (index * 10 + i)) % 1000 for i in range(count)]
            rows = [{"image": {"bytes": dog_image(i % 3, i, "JPEG"), "path": f"{split}_{index}_{i}.JPEG"},
                     "label": label} for i, label in enumerate(labels)]  # fmt: skip
            files[f"data/{split}-{index:05d}-of-{len(shards):05d}.parquet"] = parquet_bytes(rows)
        sizes[split] = sum(shards)
    features = [{"name": "image", "dtype": "image"},
                {"name": "label", "dtype": {"class_label": {"names": dict(enumerate(IMAGENET_NAMES))}}}]  # fmt: skip
    files["README.md"] = dataset_card(features, sizes, {split: f"data/{split}-*" for split in sizes})
    return files


HUB_OVERRIDES = ["--max_steps", "2", "--per_device_train_batch_size", "4", "--global_batch_size", "4",
                 "--per_device_eval_batch_size", "16", "--image_size", "48", "--dataloader_num_workers", "0",
                 "--use_cpu", "true", "--bf16", "false", "--eval_steps", "2", "--save_steps", "2",
                 "--logging_steps", "1", "--report_to", "none"]  # fmt: skip


@pytest.fixture(scope="module")
def hub_runs(tmp_path_factory):
    """`--recipe imagenet1k` and `--recipe dogs --streaming true`, each a process against one fake Hub."""
    import subprocess
    import sys

    from transformers import ViTImageProcessor, ViTModel

    from ..conftest import REPO, randomize, tiny_hf_config
    from ..fake_hub import FakeHub
    from ..test_headline import DATASET_ID, MODEL_ID, dogs_dataset_files
    from ..tools.test_hub import push_env

    tmp = tmp_path_factory.mktemp("hub_streams")
    backbone = tmp / "backbone"
    randomize(ViTModel(tiny_hf_config(image_size=32, patch_size=8))).save_pretrained(backbone)
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(backbone)
    runs = {"imagenet1k": ["--recipe", "imagenet1k"], "dogs": ["--recipe", "dogs", "--streaming", "true"]}
    with FakeHub() as hub:
        hub.add_repo(MODEL_ID, backbone)
        hub.add_repo(IMAGENET_ID, imagenet_files(), repo_type="dataset")
        hub.add_repo(DATASET_ID, dogs_dataset_files(), repo_type="dataset")
        procs = {
            name: subprocess.Popen(
                [sys.executable, str(REPO / "scripts" / "finetune.py"), *args, *HUB_OVERRIDES,
                 "--output_dir", str(tmp / name / "out")],
                cwd=tmp, env={**push_env(hub, tmp / name), "HF_TOKEN": "", "PYTHONPATH": str(REPO),
                                                        "VIT_FT_RECIPES_DIR": str(REPO / "recipes")}, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True,
            )
            for name, args in runs.items()
        }  # fmt: skip
        results = {name: (proc.communicate(timeout=600)[0], proc.returncode) for name, proc in procs.items()}
        yield {"hub": hub, "tmp": tmp, "results": results}


@pytest.mark.long  # two recipes streamed end to end through a local Hub
def test_imagenet_recipe_streams_the_stand_in(hub_runs):
    log, rc = hub_runs["results"]["imagenet1k"]
    assert rc == 0, log[-4000:]
    assert not hub_runs["hub"].unexpected
    out = hub_runs["tmp"] / "imagenet1k" / "out"
    labels = json.loads((out / "labels.json").read_text())
    assert list(labels["label2id"]) == IMAGENET_NAMES  # the names from the dataset's ClassLabel
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 2
    assert "eval_accuracy" in json.loads((out / "eval_results.json").read_text())


@pytest.mark.long
def test_dogs_recipe_streams_as_written(hub_runs):
    log, rc = hub_runs["results"]["dogs"]
    assert rc == 0, log[-4000:]
    # validation_split_percentage 0.1 of the 30 images the card states: a count of 3, held out of training
    assert "held out 3 of the 30 images" in log
    out = hub_runs["tmp"] / "dogs" / "out"
    assert "test_accuracy" in json.loads((out / "all_results.json").read_text())


# --- bad input met while the stream is read: an image that does not decode, a shard that is not a tar ---


def small_stream(tmp: Path, bad: int, **overrides) -> Path:
    """The streamed recipe on 2 shards of 8 digits images each, `bad` of them not images: 2 steps of 8 on 2
    workers read each image once."""
    recipe = streamed_recipe(tmp, max_steps=2, save_strategy="no", **overrides)
    shards = tmp / "shards"
    for shard in shards.glob("train-*.tar"):
        shard.unlink()
    files = sorted((tmp / "digits" / "train").glob("*/*.png"))[:16]
    samples = [(f"{p.parent.name}_{p.stem}", {"png": b"not an image" if i < bad else p.read_bytes(),
                                              "cls": p.parent.name.encode()}) for i, p in enumerate(files)]  # fmt: skip
    for index in range(2):
        (shards / f"train-{index:05d}.tar").write_bytes(tar_shard(samples[8 * index : 8 * index + 8]))
    return recipe


def test_a_streamed_image_that_does_not_decode_is_skipped_and_counted(tmp_path, capfd):
    recipe = small_stream(tmp_path, bad=1, max_bad_image_fraction=0.1)
    result = run_script(FINETUNE, ["--recipe", recipe], capfd, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    record = json.loads((tmp_path / "out" / "vit_ft_run.json").read_text())["bad_images"]
    assert record["skipped"] == 1 and record["of"] == 16  # the reads of the run: 2 steps of 8
    assert "Skipping image" in result.stdout + result.stderr
    # named as its batch named it in the DataLoader worker: a stream's row alone could not be named afterwards
    (named,) = record["images"]
    bad_file = sorted((tmp_path / "digits" / "train").glob("*/*.png"))[0]
    assert f"{bad_file.parent.name}_{bad_file.stem}" in named["source"], named
    assert named["reason"].startswith(("UnidentifiedImageError", "OSError", "ValueError")), named


def test_a_stream_with_too_many_bad_images_fails_with_one_line(tmp_path, capfd):
    recipe = small_stream(tmp_path, bad=3, max_bad_image_fraction=0.1)
    result = run_script(FINETUNE, ["--recipe", recipe], capfd, cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-4000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "of the 16 training images" in errors[0], result.stderr[-4000:]
    assert "max_bad_image_fraction=0.1" in errors[0]
    assert " row " not in errors[0] and "_" in errors[0].split("e.g. ")[-1], errors[0]  # named, not "row N"


def test_a_shard_that_is_not_a_tar_is_one_error_line_naming_it(tmp_path, capfd, monkeypatch):
    """A Hub dataset's shards are read only as training reaches them: the local check before training is off
    here, so that the stream's own reading meets the bad shard (in a DataLoader worker)."""
    from vit_ft.data import stream_sources

    monkeypatch.setattr(stream_sources, "_check_local_shards", lambda folder: None)
    recipe = small_stream(tmp_path, bad=0)
    (tmp_path / "shards" / "train-00001.tar").write_bytes(b"not a tar archive " * 40)
    result = run_script(FINETUNE, ["--recipe", recipe], capfd, cwd=tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-4000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr[-4000:]
    assert "train-00001.tar is not a tar archive" in errors[0] and "DataLoader worker" not in errors[0]


@pytest.mark.slow
def test_a_hub_shard_that_is_not_a_tar_fails_the_fine_tune_with_one_line(tmp_path):
    """Through the fake Hub, as a user meets it (`vit-ft finetune`'s own process): the shard is found bad when it
    is first read (a DataLoader worker's reading: tests/data/test_streaming.py)."""
    import subprocess
    import sys

    from ..conftest import REPO
    from ..fake_hub import FakeHub
    from ..tools.test_hub import push_env

    recipe = small_stream(tmp_path, bad=0, dataset_name="me/shards")
    files = {path.name: path.read_bytes() for path in (tmp_path / "shards").glob("*.tar")}
    files["train-00001.tar"] = b"not a tar archive " * 40
    with FakeHub() as hub:
        hub.add_repo("me/shards", files, repo_type="dataset")
        env = {**push_env(hub, tmp_path), "HF_TOKEN": "", "PYTHONPATH": str(REPO)}
        result = subprocess.run([sys.executable, "-m", "vit_ft", "finetune", "--recipe", str(recipe)], cwd=tmp_path,
                                env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-4000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, result.stderr[-4000:]
    assert "me/shards" in errors[0] and "train-00001.tar is not a tar archive" in errors[0]
