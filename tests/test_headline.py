"""The headline command, `accelerate launch scripts/finetune.py --recipe dogs`, end to end through a local Hub.

The fake Hub serves a tiny transformers `ViTModel` (with pooler) as the recipe's `google/vit-base-patch16-224-in21k`
and a few generated dog images as its `Donghyun99/Stanford-Dogs` (parquet, README `configs` and ClassLabel names,
train/test only). The real recipes run with size overrides only: they download both through the Hub protocol,
hold out validation, resample the 4x4 position grid to 6x6, train, evaluate, save, and push; the pushed repos then
load by id in a process without vit_ft, and the demo serves one by id.
"""

from __future__ import annotations

import io
import json
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from PIL import Image
from transformers import AutoImageProcessor, ViTImageProcessor, ViTModel

from vit_ft import ViTFTForImageClassification
from vit_ft.arguments.recipes import load_recipe, resolve_recipe
from vit_ft.data.images import load_image

from .conftest import REPO, WITHOUT_VIT_FT, randomize, tiny_hf_config
from .fake_hub import FakeHub
from .tools.test_hub import push_env

# the dogs recipes end to end through a local Hub (download, train, push, reload): CI's long step
pytestmark = pytest.mark.long

# the ids the recipes name; the fake Hub serves exactly these, so a recipe naming another one fails to download
MODEL_ID, DATASET_ID = "google/vit-base-patch16-224-in21k", "Donghyun99/Stanford-Dogs"
BREEDS = ["n02085620-Chihuahua", "n02085782-Japanese_spaniel", "n02109047-Great_Dane"]
PER_CLASS = {"train": 10, "test": 2}  # 30 train images: a stratified 10% hold-out keeps one of each breed
# a 4x4 patch grid fine-tuned on 6x6, as the recipe fine-tunes the checkpoint's 14x14 on 24x24
CHECKPOINT_SIZE, PATCH, SIZE = 32, 8, 48
PUSHED = {"dogs": "me/dogs-vit", "dogs-lora": "me/dogs-vit-lora"}
# the recipe with only sizes changed: steps, batches, resolution, workers, CPU fp32, where to write and push
SIZE_OVERRIDES = ["--max_steps", "2", "--per_device_train_batch_size", "8", "--global_batch_size", "8",
                  "--per_device_eval_batch_size", "16", "--image_size", str(SIZE), "--dataloader_num_workers", "0",
                  "--use_cpu", "true", "--bf16", "false", "--eval_steps", "2", "--save_steps", "2",
                  "--logging_steps", "1", "--push_to_hub", "true"]  # fmt: skip

CLEAN_LOAD = WITHOUT_VIT_FT + textwrap.dedent(
    """
    import json, sys
    import torch
    from transformers import AutoModelForImageClassification
    pixels_path, out_path, *repo_ids = sys.argv[1:]
    pixels, out = torch.load(pixels_path), {}
    for repo_id in repo_ids:
        model = AutoModelForImageClassification.from_pretrained(repo_id).eval()  # no remote code
        with torch.no_grad():
            out[repo_id] = {"class": type(model).__module__, "logits": model(pixels).logits.tolist()}
    assert "vit_ft" not in sys.modules
    json.dump(out, open(out_path, "w"))
    """
)


def dog_image(label: int, index: int, fmt: str) -> bytes:
    """A small photo-sized stand-in: a breed-coloured noisy image of varying shape, encoded as `fmt`."""
    rng = np.random.default_rng(100 * label + index)
    height, width = 30 + 6 * (index % 4), 40 + 5 * (index % 3)
    tint = np.array([[200, 60, 60], [60, 200, 60], [60, 60, 200]][label], dtype=np.float32)
    pixels = np.clip(tint + rng.normal(0, 40, (height, width, 3)), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, fmt)
    return buffer.getvalue()


def dogs_dataset_files() -> dict[str, bytes]:
    """A Stanford-Dogs-shaped Hub dataset: one parquet file per split (image struct, int label), and a README whose
    `dataset_info` names the classes and whose `configs` block maps the files to splits."""
    files = {}
    for split, count in PER_CLASS.items():
        fmt, suffix = ("JPEG", "jpg") if split == "train" else ("PNG", "png")
        rows = [
            {"image": {"bytes": dog_image(label, i, fmt), "path": f"{breed}_{i}.{suffix}"}, "label": label}
            for label, breed in enumerate(BREEDS)
            for i in range(count)
        ]
        buffer = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(rows), buffer)  # no datasets metadata: the names come from README
        files[f"data/{split}-00000-of-00001.parquet"] = buffer.getvalue()
    card = {
        "dataset_info": {
            "features": [
                {"name": "image", "dtype": "image"},
                {"name": "label", "dtype": {"class_label": {"names": dict(enumerate(BREEDS))}}},
            ],
            "splits": [
                {
                    "name": split,
                    "num_bytes": len(files[f"data/{split}-00000-of-00001.parquet"]),
                    "num_examples": count * len(BREEDS),
                }
                for split, count in PER_CLASS.items()
            ],  # fmt: skip
        },
        "configs": [
            {
                "config_name": "default",
                "data_files": [{"split": split, "path": f"data/{split}-*"} for split in PER_CLASS],
            }
        ],
    }
    files["README.md"] = (
        f"---\n{yaml.safe_dump(card, sort_keys=False)}---\n# Stanford Dogs (test stand-in)\n".encode()
    )
    return files


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(command: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    """A subprocess whose output goes to cwd/log.txt (a pipe nobody reads would stall it once full)."""
    cwd.mkdir(parents=True, exist_ok=True)
    with open(cwd / "log.txt", "w") as log:
        return subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def headline(tmp_path_factory):
    """Both recipes launched at once against one fake Hub, then the demo started on the pushed dogs repo.

    Yields {"hub", "tmp", "backbone", "runs": {recipe: {"rc", "log", "out"}}, "downloads" (the fine-tunes'),
    "demo": (process, url, its HF_HOME) or None}.
    """
    tmp = tmp_path_factory.mktemp("headline")
    backbone = tmp / "backbone"
    randomize(ViTModel(tiny_hf_config(image_size=CHECKPOINT_SIZE, patch_size=PATCH))).save_pretrained(
        backbone
    )
    ViTImageProcessor(size={"height": CHECKPOINT_SIZE, "width": CHECKPOINT_SIZE}).save_pretrained(backbone)
    with FakeHub() as hub:
        hub.add_repo(MODEL_ID, backbone)
        hub.add_repo(DATASET_ID, dogs_dataset_files(), repo_type="dataset")
        procs = {}
        for name, repo_id in PUSHED.items():
            command = [sys.executable, "-m", "accelerate.commands.launch", str(REPO / "scripts" / "finetune.py"),
                       "--recipe", name, *SIZE_OVERRIDES, "--hub_model_id", repo_id,
                       "--output_dir", str(tmp / name / "out")]  # fmt: skip
            procs[name] = start(command, tmp / name, push_env(hub, tmp / name))
        runs = {}
        for name, proc in procs.items():
            proc.wait(timeout=600)
            log = (tmp / name / "log.txt").read_text()
            runs[name] = {"rc": proc.returncode, "log": log, "out": tmp / name / "out"}
        downloads = list(hub.downloads)
        demo = None
        if runs["dogs"]["rc"] == 0:  # started now, so that it boots while the clean-load test runs
            port = free_port()
            env = {
                k: v for k, v in push_env(hub, tmp / "demo").items() if k != "HF_TOKEN"
            }  # a user's machine
            command = [
                sys.executable,
                str(REPO / "demo" / "app.py"),
                "--model",
                PUSHED["dogs"],
                "--port",
                str(port),
            ]
            demo = (start(command, tmp / "demo", env), f"http://127.0.0.1:{port}/", Path(env["HF_HOME"]))
        try:
            yield {
                "hub": hub,
                "tmp": tmp,
                "backbone": backbone,
                "runs": runs,
                "downloads": downloads,
                "demo": demo,
            }
        finally:
            if demo is not None:
                demo[0].terminate()
                demo[0].wait(timeout=30)


@pytest.mark.parametrize("name", list(PUSHED))
def test_recipe_downloads_trains_and_pushes(headline, name):
    hub, run = headline["hub"], headline["runs"][name]
    assert run["rc"] == 0, run["log"][-4000:]
    assert not hub.unexpected, f"requests the fake Hub does not know: {hub.unexpected}"
    recipe = load_recipe(resolve_recipe(name))

    # both downloads went through the Hub protocol, under exactly the recipe's ids
    assert (recipe["model_name_or_path"], recipe["dataset_name"]) == (MODEL_ID, DATASET_ID)
    downloaded = {(kind, repo_id) for kind, repo_id, _ in headline["downloads"]}
    assert downloaded == {("model", MODEL_ID), ("dataset", DATASET_ID)}

    # the splits: the mirror's train and test, with validation held out of train (10%, one image per breed)
    held_out = round(recipe["validation_split_percentage"] * PER_CLASS["train"] * len(BREEDS))
    train = PER_CLASS["train"] * len(BREEDS) - held_out
    split_sizes = f"{{'train': {train}, 'validation': {held_out}, 'test': {PER_CLASS['test'] * len(BREEDS)}}}"
    assert f"Data: {split_sizes}; 3 classes" in run["log"]
    out = run["out"]
    record = json.loads((out / "vit_ft_run.json").read_text())
    assert record["finished"] and record["recipe"] == name and record["lora"] == recipe["use_lora"]
    assert record["base_model"] == recipe["model_name_or_path"]
    assert record["data"]["dataset_name"] == recipe["dataset_name"] and record["image_size"] == [SIZE, SIZE]
    assert {"eval_accuracy", "test_accuracy"} <= set(record["metrics"])
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 2

    # resampled: the loading report says 4x4 -> 6x6, and the table matches transformers' own interpolation
    # (exactly for LoRA, whose position embeddings are frozen; within two small SGD steps for full fine-tuning)
    grid = f"{CHECKPOINT_SIZE // PATCH}x{CHECKPOINT_SIZE // PATCH} -> {SIZE // PATCH}x{SIZE // PATCH}"
    assert grid in run["log"]
    base = ViTModel.from_pretrained(headline["backbone"]).eval()
    tokens = 1 + (SIZE // PATCH) ** 2
    with torch.no_grad():
        expected = base.embeddings.interpolate_pos_encoding(torch.zeros(1, tokens, 32), SIZE, SIZE)
    model = ViTFTForImageClassification.from_pretrained(out).eval()
    assert model.config.image_size == [SIZE, SIZE] and model.config.id2label == dict(enumerate(BREEDS))
    (table,) = [p for n, p in model.named_parameters() if n.endswith("position_embeddings")]
    assert table.shape == expected.shape
    tolerance = 1e-6 if recipe["use_lora"] else 0.05
    assert (table - expected).abs().max().item() <= tolerance

    # pushed under the hub_model_id as transformers' own ViT (no code to trust), with processor, card and record
    files = hub.repos[PUSHED[name]]
    assert json.loads(files["config.json"])["model_type"] == "vit"
    assert {"model.safetensors", "config.json", "preprocessor_config.json", "README.md", "vit_ft_run.json"} <= set(files)
    assert not [file for file in files if file.endswith(".py")]


def test_pushed_repos_load_by_id_without_vit_ft(headline):
    """A fresh process that cannot import vit_ft downloads each pushed repo by id: same logits as the folders."""
    hub, tmp = headline["hub"], headline["tmp"]
    assert all(run["rc"] == 0 for run in headline["runs"].values()), "a fine-tune failed (see the test above)"
    pixels = torch.randn(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(0))
    torch.save(pixels, tmp / "pixels.pt")
    env = {k: v for k, v in push_env(hub, tmp / "clean").items() if k != "HF_TOKEN"}  # a user without a token
    result = subprocess.run(
        [sys.executable, "-c", CLEAN_LOAD, str(tmp / "pixels.pt"), str(tmp / "clean.json"), *PUSHED.values()],
        cwd=tmp, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert not hub.unexpected, f"requests the fake Hub does not know: {hub.unexpected}"
    out = json.loads((tmp / "clean.json").read_text())
    for name, repo_id in PUSHED.items():
        assert out[repo_id]["class"] == "transformers.models.vit.modeling_vit"  # transformers' own ViT
        with torch.no_grad():
            expected = ViTFTForImageClassification.from_pretrained(headline["runs"][name]["out"]).eval()(
                pixels
            )
        assert (torch.tensor(out[repo_id]["logits"]) - expected.logits).abs().max().item() <= 1e-5, name


def test_demo_serves_the_pushed_repo_by_id(headline):
    """`python demo/app.py --model <hub id>` downloads the pushed repo and answers /predict as the model does."""
    from gradio_client import Client, handle_file

    hub, tmp = headline["hub"], headline["tmp"]
    assert headline["demo"] is not None, "the dogs fine-tune failed (see the test above)"
    demo, url, hf_home = headline["demo"]
    deadline = time.monotonic() + 180
    while True:
        assert demo.poll() is None, f"the demo exited:\n{(tmp / 'demo' / 'log.txt').read_text()[-4000:]}"
        assert time.monotonic() < deadline, "the demo did not start within 180 s"
        try:
            urllib.request.urlopen(url, timeout=5).close()
            break
        except OSError:
            time.sleep(0.5)
    image = tmp / "great_dane.png"
    image.write_bytes(dog_image(2, 7, "PNG"))
    result = Client(url, verbose=False, analytics_enabled=False).predict(
        handle_file(str(image)), api_name="/predict"
    )
    assert not hub.unexpected, f"requests the fake Hub does not know: {hub.unexpected}"
    # its cache started empty: the weights in it came from the fake Hub, under the pushed id
    assert list((hf_home / "hub").glob("models--me--dogs-vit/snapshots/*/model.safetensors"))

    folder = headline["runs"]["dogs"]["out"]
    model = ViTFTForImageClassification.from_pretrained(folder).eval()
    pixels = AutoImageProcessor.from_pretrained(folder)(images=load_image(image), return_tensors="pt")[
        "pixel_values"
    ]
    with torch.no_grad():
        probs = model(pixel_values=pixels).logits[0].softmax(-1)
    assert result["label"] == BREEDS[probs.argmax().item()]
    assert len(result["confidences"]) == len(BREEDS)
    for entry in result["confidences"]:
        assert entry["confidence"] == pytest.approx(probs[BREEDS.index(entry["label"])].item(), abs=1e-5)
