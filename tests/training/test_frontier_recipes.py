"""The issue-36 recipes, `pets-dinov3`, `pets-siglip2` and `imagenet1k-mae`, end to end through the local Hub, and
a recipe run on another family's checkpoint taking that family's defaults (`arguments/family_defaults.py`).

As tests/training/test_family_recipes.py: the fake Hub serves a tiny checkpoint saved by transformers' own class
under each recipe's model id (`DINOv3ViTModel`, a whole image-text `Siglip2Model` as google/siglip2-base-patch16-naflex
is, `ViTMAEForPreTraining` with its pixel decoder as facebook/vit-mae-base is), the Stanford-Dogs-shaped set under
timm/oxford-iiit-pet and the ImageNet stand-in under ILSVRC/imagenet-1k (streamed, as the recipe says). Each runs
once with only sizes overridden, a process each; the trained folder reloads through the tools."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from transformers import (
    DINOv3ViTConfig,
    DINOv3ViTModel,
    Siglip2Config,
    Siglip2ImageProcessor,
    Siglip2Model,
    ViTImageProcessor,
    ViTMAEConfig,
    ViTMAEForPreTraining,
)

from vit_ft import ViTFTForImageClassification
from vit_ft.arguments.family_defaults import FAMILY_DEFAULTS
from vit_ft.arguments.recipes import load_recipe, resolve_recipe
from vit_ft.tools.trained import load_trained

from ..conftest import REPO, randomize
from ..fake_hub import FakeHub
from ..test_headline import CHECKPOINT_SIZE, PATCH, SIZE, dogs_dataset_files, start
from ..tools.test_hub import push_env
from .test_family_recipes import OVERRIDES, TEXT, TINY_VISION
from .test_streaming_finetune import IMAGENET_ID, imagenet_files

# four tiny fine-tunes in their own processes through a local Hub, end to end: CI's long step (the recipes' keys
# and defaults are tested as tables over the plan in tests/arguments)
pytestmark = [pytest.mark.slow, pytest.mark.long]

IMAGENET_MEAN, IMAGENET_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
PETS_ID, MAE_ID, DINOV3_ID = "timm/oxford-iiit-pet", "facebook/vit-mae-base", "facebook/dinov3-vitb16-pretrain-lvd1689m"
SIGLIP2_ID = "google/siglip2-base-patch16-naflex"


def dinov3_checkpoint():
    """facebook/dinov3-vitb16-pretrain-lvd1689m in small: rotary positions, registers, layer scale."""
    model = DINOv3ViTModel(DINOv3ViTConfig(**TINY_VISION, num_register_tokens=2))
    return model, ViTImageProcessor(size={"height": CHECKPOINT_SIZE, "width": CHECKPOINT_SIZE},
                                    image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD)  # fmt: skip


def siglip2_checkpoint():
    """google/siglip2-base-patch16-naflex in small: a Siglip2Model (NaFlex: a table of `num_patches` positions
    resized per image) and its processor with the same patch budget."""
    vision = {k: v for k, v in TINY_VISION.items() if k != "image_size"}
    budget = (CHECKPOINT_SIZE // vision["patch_size"]) ** 2
    model = Siglip2Model(Siglip2Config(vision_config={**vision, "num_patches": budget}, text_config=TEXT))
    return model, Siglip2ImageProcessor(patch_size=vision["patch_size"], max_num_patches=budget)


def mae_checkpoint():
    """facebook/vit-mae-base in small: ViTMAEForPreTraining, its pixel decoder and the pre-training mask ratio."""
    decoder = {"decoder_hidden_size": 16, "decoder_num_hidden_layers": 1, "decoder_num_attention_heads": 2,
               "decoder_intermediate_size": 32}  # fmt: skip
    model = ViTMAEForPreTraining(ViTMAEConfig(**TINY_VISION, **decoder))
    return model, ViTImageProcessor(size={"height": CHECKPOINT_SIZE, "width": CHECKPOINT_SIZE},
                                    image_mean=IMAGENET_MEAN, image_std=IMAGENET_STD)  # fmt: skip


# run -> (recipe, model id served, dataset id, builder, the class in the loading report, extra flags)
RUNS = {
    "pets-dinov3": ("pets-dinov3", DINOV3_ID, PETS_ID, dinov3_checkpoint, "DINOv3ViTModel", []),
    "pets-siglip2": ("pets-siglip2", SIGLIP2_ID, PETS_ID, siglip2_checkpoint, "Siglip2Model",
                     ["--max_num_patches", str((CHECKPOINT_SIZE // PATCH) ** 2)]),  # fmt: skip
    "imagenet1k-mae": ("imagenet1k-mae", MAE_ID, IMAGENET_ID, mae_checkpoint, "ViTMAEForPreTraining", []),
    # a DINOv3 recipe on an MAE checkpoint: MAE's protocol replaces the recipe's optimisation keys, but the flag's
    "cross-family": ("pets-dinov3", MAE_ID, PETS_ID, mae_checkpoint, "ViTMAEForPreTraining",
                     ["--model_name_or_path", MAE_ID, "--weight_decay", "0.2"]),  # fmt: skip
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every run against one fake Hub, two at a time: run -> {"rc", "log", "out", "backbone"}, and the hub."""
    tmp = tmp_path_factory.mktemp("frontier_recipes")
    datasets = {PETS_ID: dogs_dataset_files(), IMAGENET_ID: imagenet_files()}
    out = {}
    with FakeHub() as hub:
        served = set()
        for seed, (name, (_, model_id, _, build, _, _)) in enumerate(RUNS.items()):
            if model_id in served:
                continue
            model, processor = build()
            randomize(model, seed=seed).save_pretrained(tmp / name / "backbone")
            processor.save_pretrained(tmp / name / "backbone")
            hub.add_repo(model_id, tmp / name / "backbone")
            served.add(model_id)
        for dataset_id, files in datasets.items():
            hub.add_repo(dataset_id, files, repo_type="dataset")
        names = list(RUNS)
        for pair in (names[:2], names[2:]):  # two processes at a time on a shared machine
            procs = {}
            for name in pair:
                recipe, *_, extra = RUNS[name]
                command = [sys.executable, str(REPO / "scripts" / "finetune.py"), "--recipe", recipe, *OVERRIDES,
                           *extra, "--output_dir", str(tmp / name / "out")]  # fmt: skip
                env = {**push_env(hub, tmp / name), "PYTHONPATH": str(REPO),
                       "VIT_FT_RECIPES_DIR": str(REPO / "recipes")}  # fmt: skip
                procs[name] = start(command, tmp / name / "run", env)
            for name, proc in procs.items():
                proc.wait(timeout=600)
                out[name] = {"rc": proc.returncode, "log": (tmp / name / "run" / "log.txt").read_text(),
                             "out": tmp / name / "out"}  # fmt: skip
        yield out, hub


@pytest.mark.parametrize("name", list(RUNS))
def test_recipe_downloads_trains_and_reloads(runs, name):
    runs, hub = runs
    run, (recipe_name, model_id, dataset_id, _, architecture, _) = runs[name], RUNS[name]
    assert run["rc"] == 0, run["log"][-4000:]
    assert not hub.unexpected, f"requests the fake Hub does not know: {hub.unexpected}"
    assert {model_id, dataset_id} <= hub.downloaded() | hub.downloaded("dataset")
    assert f"from {model_id} (transformers {architecture})." in run["log"]
    if architecture == "ViTMAEForPreTraining":
        assert "discarded decoder." in run["log"]  # the pixel decoder, said so
    record = json.loads((run["out"] / "vit_ft_run.json").read_text())
    assert record["finished"] and record["recipe"] == recipe_name and record["base_model"] == model_id
    assert json.loads((run["out"] / "trainer_state.json").read_text())["global_step"] == 2

    trained = load_trained(run["out"], device="cpu")
    config, recipe = trained.model.config, load_recipe(resolve_recipe(recipe_name))
    if name == "pets-dinov3":
        assert config.rope_theta is not None and config.num_register_tokens == 2
    if name == "pets-siglip2":
        assert not config.class_token and config.pooling == recipe["pooling"] == "map"
        assert config.max_num_patches == (CHECKPOINT_SIZE // PATCH) ** 2  # NaFlex, the recipe's key at test size
    if name in ("imagenet1k-mae", "cross-family"):  # MAE's layout: the token mean, then the new fc_norm
        assert config.pooling == "mean" and config.fc_norm
    pixels = torch.randn(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(0))
    reference = ViTFTForImageClassification.from_pretrained(run["out"]).eval()
    with torch.no_grad():
        expected, got = reference(pixels).logits, trained.model(pixels.to(trained.device)).logits
    assert expected.abs().max() > 0
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


def test_a_recipe_on_its_own_family_records_no_family_defaults(runs):
    runs, _ = runs
    for name in ("pets-dinov3", "pets-siglip2", "imagenet1k-mae"):
        assert json.loads((runs[name]["out"] / "vit_ft_run.json").read_text())["family_defaults"] is None
        assert "Family defaults" not in runs[name]["log"]


def test_another_familys_checkpoint_takes_its_defaults_first_and_records_them(runs):
    runs, _ = runs
    run, recipe = runs["cross-family"], load_recipe(resolve_recipe("pets-dinov3"))
    mae = FAMILY_DEFAULTS["mae"].values
    decision = json.loads((run["out"] / "vit_ft_run.json").read_text())["family_defaults"]
    assert (decision["checkpoint_family"], decision["recipe_family"]) == ("mae", "dinov3")
    taken = {row["key"]: row["value"] for row in decision["taken"]}
    changed = {key for key, value in mae.items() if value != recipe.get(key)} - {"weight_decay"}
    assert set(taken) == changed and all(taken[key] == mae[key] for key in taken)
    assert decision["kept_flags"] == ["weight_decay"]
    args = torch.load(run["out"] / "training_args.bin", weights_only=False)
    assert args.learning_rate == mae["learning_rate"] != recipe["learning_rate"]
    assert args.layer_decay == mae["layer_decay"] and args.weight_decay == 0.2  # the flag wins
    # the run's first lines: the decision, then the batch
    lines = [line for line in run["log"].splitlines() if "Family defaults" in line or "Batch: global" in line]
    assert "Family defaults: " in lines[0] and "is MAE" in lines[0] and "written for DINOv3" in lines[0]
    assert "Batch: global" in lines[1]
    assert "  learning_rate = 0.001 (MAE default; the recipe's 2e-05); override with --learning_rate" in run["log"]
