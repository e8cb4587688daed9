"""The ViT-family recipes, `dogs-dinov2` and `pets-siglip`, end to end through the local Hub.

As tests/test_headline.py runs `dogs`: the fake Hub serves a tiny checkpoint saved by transformers' own class
under the recipe's model id (a `Dinov2Model` with DINOv2's `BitImageProcessor`, a whole `SiglipModel` image-text
checkpoint with its `SiglipImageProcessor`) and the generated Stanford-Dogs-shaped dataset under the recipe's
dataset id (timm/oxford-iiit-pet has the same schema: image, label, train/test). Each recipe runs once with only
sizes overridden, in one process each (both at once; the plain script, as test_headline runs the launcher); its
trained folder then reloads through the tools."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from transformers import (
    BitImageProcessor,
    Dinov2Config,
    Dinov2Model,
    SiglipConfig,
    SiglipImageProcessor,
    SiglipModel,
)

from vit_ft import ViTFTForImageClassification
from vit_ft.arguments.recipes import load_recipe, resolve_recipe
from vit_ft.tools.trained import load_trained

from ..conftest import REPO, randomize
from ..fake_hub import FakeHub
from ..test_headline import BREEDS, CHECKPOINT_SIZE, PATCH, SIZE, SIZE_OVERRIDES, dogs_dataset_files, start
from ..tools.test_hub import push_env

# each family recipe end to end through a local Hub, in its own process: CI's long step
pytestmark = pytest.mark.long

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4}
TINY_VISION = {**TINY, "intermediate_size": 64, "image_size": CHECKPOINT_SIZE, "patch_size": PATCH}
TEXT = {**TINY, "intermediate_size": 64, "vocab_size": 50}
# the headline's overrides without its push (the pushed folder is the trained one; test_headline checks pushes)
OVERRIDES = [*SIZE_OVERRIDES[: SIZE_OVERRIDES.index("--push_to_hub")], "--push_to_hub", "false"]


def dinov2_backbone() -> tuple[torch.nn.Module, BitImageProcessor]:
    """facebook/dinov2-base in small: Dinov2Model (layer scale, cls-slot positions) and its BitImageProcessor."""
    model = Dinov2Model(Dinov2Config(**TINY, mlp_ratio=2, image_size=CHECKPOINT_SIZE, patch_size=PATCH))
    processor = BitImageProcessor(  # the checkpoint's settings: ImageNet mean/std, resize 256 then crop 224
        size={"shortest_edge": CHECKPOINT_SIZE}, crop_size=CHECKPOINT_SIZE, do_convert_rgb=True,
        image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225],
    )  # fmt: skip
    return model, processor


def siglip_checkpoint() -> tuple[torch.nn.Module, SiglipImageProcessor]:
    """google/siglip-base-patch16-224 in small: the whole image-text SiglipModel and its SiglipImageProcessor."""
    model = SiglipModel(SiglipConfig(vision_config=TINY_VISION, text_config=TEXT))
    processor = SiglipImageProcessor(size={"height": CHECKPOINT_SIZE, "width": CHECKPOINT_SIZE})
    return model, processor


# recipe -> (model id, dataset id, the checkpoint builder, the family's name in the loading report)
RECIPES = {
    "dogs-dinov2": ("facebook/dinov2-base", "Donghyun99/Stanford-Dogs", dinov2_backbone, "Dinov2Model"),
    "pets-siglip": (
        "google/siglip-base-patch16-224",
        "timm/oxford-iiit-pet",
        siglip_checkpoint,
        "SiglipModel",
    ),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both recipes launched at once against one fake Hub: recipe -> {"rc", "log", "out", "backbone", "hub"}."""
    tmp = tmp_path_factory.mktemp("family_recipes")
    dataset = dogs_dataset_files()
    with FakeHub() as hub:
        procs = {}
        for seed, (name, (model_id, dataset_id, build, _)) in enumerate(RECIPES.items()):
            model, processor = build()
            randomize(model, seed=seed).save_pretrained(tmp / name / "backbone")
            processor.save_pretrained(tmp / name / "backbone")
            hub.add_repo(model_id, tmp / name / "backbone")
            hub.add_repo(dataset_id, dataset, repo_type="dataset")
            # one process, without accelerate's launcher (test_headline runs the launcher)
            command = [sys.executable, str(REPO / "scripts" / "finetune.py"), "--recipe", name, *OVERRIDES,
                       "--output_dir", str(tmp / name / "out")]  # fmt: skip
            procs[name] = start(command, tmp / name / "run", push_env(hub, tmp / name))
        out = {}
        for name, proc in procs.items():
            proc.wait(timeout=600)
            out[name] = {"rc": proc.returncode, "log": (tmp / name / "run" / "log.txt").read_text(),
                         "out": tmp / name / "out", "backbone": tmp / name / "backbone"}  # fmt: skip
        yield out, hub


@pytest.mark.parametrize("name", list(RECIPES))
def test_family_recipe_downloads_trains_and_reloads(runs, name):
    runs, hub = runs
    run, (model_id, dataset_id, _, architecture) = runs[name], RECIPES[name]
    assert run["rc"] == 0, run["log"][-4000:]
    assert not hub.unexpected, f"requests the fake Hub does not know: {hub.unexpected}"
    recipe = load_recipe(resolve_recipe(name))
    assert (recipe["model_name_or_path"], recipe["dataset_name"]) == (model_id, dataset_id)
    assert {model_id, dataset_id} <= hub.downloaded() | hub.downloaded("dataset")

    # the loading report names the family's class, the resampled grid and (SigLIP) the discarded text tower
    assert f"from {model_id} (transformers {architecture})." in run["log"]
    grid = f"{CHECKPOINT_SIZE // PATCH}x{CHECKPOINT_SIZE // PATCH} -> {SIZE // PATCH}x{SIZE // PATCH}"
    assert grid in run["log"]
    if name == "pets-siglip":
        assert "discarded text_model." in run["log"]
    record = json.loads((run["out"] / "vit_ft_run.json").read_text())
    assert record["finished"] and record["recipe"] == name and record["base_model"] == model_id
    assert json.loads((run["out"] / "trainer_state.json").read_text())["global_step"] == 2

    # the trained folder keeps the family's architecture and the recipe's pooling, and normalises as the
    # checkpoint's own image processor does (DINOv2: ImageNet mean/std; SigLIP: 0.5)
    trained = load_trained(run["out"], device="cpu")
    config = trained.model.config
    assert config.pooling == recipe["pooling"] and config.id2label == dict(enumerate(BREEDS))
    if name == "dogs-dinov2":
        assert config.layerscale_value is not None and config.class_token
    else:
        assert not config.class_token and config.no_embed_class and config.hidden_act == "gelu_pytorch_tanh"
    base_processor = json.loads((run["backbone"] / "preprocessor_config.json").read_text())
    assert trained.preprocessing.mean == pytest.approx(base_processor["image_mean"])
    assert trained.preprocessing.std == pytest.approx(base_processor["image_std"])

    # the tools' model gives the logits the saved folder gives (our class, loaded directly)
    pixels = torch.randn(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(0))
    reference = ViTFTForImageClassification.from_pretrained(run["out"]).eval()
    with torch.no_grad():
        expected, got = reference(pixels).logits, trained.model(pixels.to(trained.device)).logits
    assert expected.abs().max() > 0  # trained: the zero head moved
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
