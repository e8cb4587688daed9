"""The `voc2007-multilabel` recipe end to end through the local Hub, with the schema of its dataset.

`clip-benchmark/wds_voc2007_multilabel` is a webdataset: tar shards per split whose members `<key>.webp` (the
image) and `<key>.npy` (a numpy int array of 20 zeros and ones, one per VOC label) datasets' webdataset builder
reads as the columns `webp` (Image), `npy` (List(int64)), `__key__` and `__url__`; the label names are not in the
data but in its classnames.txt, which the recipe lists as `class_names`. The fake Hub serves a small set of such
shards and a tiny transformers ViTModel under the recipe's model id; the recipe runs with only sizes changed, and
its trained folder must be a multi-label VOC classifier whose test mAP is scikit-learn's on the same images."""

from __future__ import annotations

import io
import json
import sys
import tarfile
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from sklearn.metrics import average_precision_score
from transformers import ViTImageProcessor, ViTModel

from vit_ft.arguments.recipes import load_recipe, resolve_recipe
from vit_ft.metrics.multilabel import MULTI_LABEL, sigmoid
from vit_ft.tools.trained import load_trained

from ..conftest import REPO, randomize, tiny_hf_config
from ..fake_hub import FakeHub
from ..test_headline import CHECKPOINT_SIZE, PATCH, SIZE_OVERRIDES, start
from ..tools.test_hub import push_env

RECIPE = "voc2007-multilabel"
VOC = ["aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow", "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor"]  # fmt: skip
OVERRIDES = [*SIZE_OVERRIDES[: SIZE_OVERRIDES.index("--push_to_hub")], "--push_to_hub", "false"]


def voc_labels(rng: np.random.Generator) -> np.ndarray:
    """A VOC-like label vector: one to three of the 20 labels, "person" (14) most often."""
    labels = np.zeros(len(VOC), dtype=np.int64)
    labels[rng.choice(len(VOC), size=rng.integers(1, 4), replace=False)] = 1
    if rng.random() < 0.4:
        labels[VOC.index("person")] = 1
    return labels


def shard(count: int, seed: int) -> bytes:
    """One webdataset tar: `<key>.webp` and `<key>.npy` per sample, as clip-benchmark's shards hold them."""
    rng, buffer = np.random.default_rng(seed), io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for i in range(count):
            height, width = 30 + 4 * (i % 3), 40 + 3 * (i % 4)
            labels = voc_labels(rng)
            image = rng.integers(0, 60, (height, width, 3)) + 9 * labels.argmax()  # a tint per first label
            members = {"webp": io.BytesIO(), "npy": io.BytesIO()}
            Image.fromarray(image.clip(0, 255).astype(np.uint8)).save(members["webp"], "WEBP", quality=90)
            np.save(members["npy"], labels)
            for suffix, member in members.items():
                info = tarfile.TarInfo(f"s{seed}_{i:05d}.{suffix}")
                info.size = len(member.getvalue())
                tar.addfile(info, io.BytesIO(member.getvalue()))
    return buffer.getvalue()


TAGS_ID, TAGS = "me/street-tags", ["car", "person", "tree"]


def tags_dataset_files(tmp: Path) -> dict[str, bytes]:
    """A Hub dataset whose label column is Sequence(ClassLabel) (as jonathan-roberts1/AID_MultiLabel's), in
    parquet files that carry datasets' feature metadata, and a README mapping them to train / test."""
    rng, files = np.random.default_rng(5), {}
    features = datasets.Features(
        {"image": datasets.Image(), "labels": datasets.Sequence(datasets.ClassLabel(names=TAGS))}
    )
    for split, count in (("train", 40), ("test", 12)):
        labels = [
            sorted(rng.choice(3, size=rng.integers(0, 3), replace=False).tolist()) for _ in range(count)
        ]
        images = [Image.fromarray(rng.integers(0, 255, (20, 24, 3), dtype=np.uint8)) for _ in range(count)]
        path = tmp / f"{split}.parquet"
        datasets.Dataset.from_dict({"image": images, "labels": labels}, features=features).to_parquet(
            str(path)
        )
        files[f"data/{split}-00000-of-00001.parquet"] = path.read_bytes()
    configs = [
        {
            "config_name": "default",
            "data_files": [{"split": s, "path": f"data/{s}-*"} for s in ("train", "test")],
        }
    ]
    files["README.md"] = (
        f"---\n{yaml.safe_dump({'configs': configs})}---\n# street tags (test stand-in)\n".encode()
    )
    return files


def voc_dataset_files() -> dict[str, bytes]:
    return {
        "train/0.tar": shard(40, seed=1),
        "test/0.tar": shard(24, seed=2),
        "classnames.txt": ("\n".join(VOC) + "\n").encode(),
    }


@pytest.fixture(scope="module")
def voc_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("voc")
    recipe = load_recipe(resolve_recipe(RECIPE))
    backbone = tmp / "backbone"
    randomize(ViTModel(tiny_hf_config(image_size=CHECKPOINT_SIZE, patch_size=PATCH))).save_pretrained(
        backbone
    )
    ViTImageProcessor(size={"height": CHECKPOINT_SIZE, "width": CHECKPOINT_SIZE}).save_pretrained(backbone)
    files = voc_dataset_files()
    with FakeHub() as hub:
        hub.add_repo(recipe["model_name_or_path"], backbone)
        hub.add_repo(recipe["dataset_name"], files, repo_type="dataset")
        hub.add_repo(TAGS_ID, tags_dataset_files(tmp), repo_type="dataset")
        runs = {
            "voc": ["--recipe", RECIPE],
            # the same recipe on a Sequence(ClassLabel) dataset: its own columns, no class_names needed
            "tags": ["--recipe", RECIPE, "--dataset_name", TAGS_ID, "--image_column", "image", "--label_column",
                     "labels", "--class_names", "none", "--problem_type", "none"],
        }  # fmt: skip
        processes = {
            name: start([sys.executable, str(REPO / "scripts" / "finetune.py"), *args, *OVERRIDES, "--output_dir",
                         str(tmp / name / "out")], tmp / name / "run", push_env(hub, tmp / name))
            for name, args in runs.items()
        }  # fmt: skip
        for process in processes.values():
            process.wait(timeout=600)
        results = {
            name: {"rc": process.returncode, "log": (tmp / name / "run" / "log.txt").read_text(),
                   "out": tmp / name / "out"}
            for name, process in processes.items()
        }  # fmt: skip
        yield {**results["voc"], "tags": results["tags"], "files": files, "hub": hub, "recipe": recipe}


def test_voc_recipe_names_the_dataset_and_its_labels():
    recipe = load_recipe(resolve_recipe(RECIPE))
    assert recipe["dataset_name"] == "clip-benchmark/wds_voc2007_multilabel"
    assert (recipe["image_column"], recipe["label_column"]) == ("webp", "npy")
    assert recipe["class_names"] == VOC and recipe["metric_for_best_model"] == "mAP"


@pytest.mark.long  # the recipe end to end through a local Hub
def test_voc_recipe_trains_a_multilabel_classifier_through_the_hub(voc_run, tmp_path):
    assert voc_run["rc"] == 0, voc_run["log"][-4000:]
    assert not voc_run["hub"].unexpected, voc_run["hub"].unexpected
    assert voc_run["recipe"]["dataset_name"] in voc_run["hub"].downloaded("dataset")
    out = voc_run["out"]
    trained = load_trained(out, device="cpu")
    assert trained.task.problem_type == MULTI_LABEL and list(trained.id2label.values()) == VOC
    record = json.loads((out / "vit_ft_run.json").read_text())
    assert record["decision_threshold"]["split"] == "validation"
    assert 0 < record["decision_threshold"]["value"] < 1

    # the test split as the webdataset builder reads it (from the same shards, here without the Hub)
    for name, data in voc_run["files"].items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    test = datasets.load_dataset(
        "webdataset", data_files={"test": str(tmp_path / "test" / "0.tar")}, split="test"
    )
    assert set(test.column_names) == {"webp", "npy", "__key__", "__url__"}
    labels = np.array(test["npy"])
    pixels = torch.stack(
        trained.transform({"image": test.cast_column("webp", datasets.Image(decode=False))["webp"]})[
            "pixel_values"
        ]
    )
    probabilities = sigmoid(trained.logits(pixels).numpy())
    present = labels.sum(0) > 0
    expected = average_precision_score(labels[:, present], probabilities[:, present], average="macro")
    assert record["metrics"]["test_mAP"] == pytest.approx(expected, abs=1e-4)


@pytest.mark.long
def test_a_hub_dataset_with_a_sequence_of_classlabel_column(voc_run):
    run = voc_run["tags"]
    assert run["rc"] == 0, run["log"][-4000:]
    assert TAGS_ID in voc_run["hub"].downloaded("dataset")
    trained = load_trained(run["out"], device="cpu")
    assert trained.task.problem_type == MULTI_LABEL and list(trained.id2label.values()) == TAGS  # the ClassLabel's names
    record = json.loads((run["out"] / "vit_ft_run.json").read_text())
    assert record["decision_threshold"]["split"] == "validation" and "test_mAP" in record["metrics"]
