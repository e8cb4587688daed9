"""A pooling the checkpoint cannot do: a class-token pooling (cls, cls+mean) on SigLIP, which has no class token, is
refused before any data loads (`vit_ft.arguments.checks.check_pooling`), as timm refuses global_pool='token' with
class_token=False; the model's config refuses it too where the checkpoint is not on this machine yet. The
checkpoint's own pooling (map) and mean are accepted, and such a fine-tune saves a folder every tool loads."""

from __future__ import annotations

import pytest
from transformers import SiglipConfig, SiglipModel, ViTModel

from vit_ft import ViTFTConfig, ViTFTForImageClassification
from vit_ft.arguments.checks import CLASS_TOKEN_POOLINGS, RecipeError, check_pooling
from vit_ft.arguments.fields import ModelArguments
from vit_ft.arguments.recipes import parse_args
from vit_ft.model.configuration_vit_ft import POOLING_CHOICES
from vit_ft.tools.trained import load_trained

from ..cli_runner import run_script
from ..conftest import randomize, tiny_hf_config, write_tiny_recipe
from ..model.test_families import TEXT, VISION


@pytest.fixture(scope="module")
def siglip_dir(tmp_path_factory) -> str:
    """The tiny image-text SigLIP checkpoint of tests/model/test_families.py, saved by transformers."""
    folder = tmp_path_factory.mktemp("siglip")
    model = SiglipModel(SiglipConfig(vision_config=VISION, text_config={**TEXT, "vocab_size": 50}))
    randomize(model).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def vit_dir(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("vit")
    randomize(ViTModel(tiny_hf_config())).save_pretrained(folder)
    return str(folder)


def test_the_class_token_poolings_are_the_ones_the_config_refuses_without_a_class_token():
    for pooling in POOLING_CHOICES:
        refused = pooling in CLASS_TOKEN_POOLINGS
        try:
            ViTFTConfig(class_token=False, no_embed_class=True, pooling=pooling)
        except ValueError:
            assert refused, pooling
        else:
            assert not refused, pooling


@pytest.mark.parametrize("pooling", CLASS_TOKEN_POOLINGS)
def test_a_class_token_pooling_on_siglip_is_one_line_naming_the_checkpoint_and_its_own(siglip_dir, pooling):
    with pytest.raises(RecipeError) as error:
        check_pooling(ModelArguments(model_name_or_path=siglip_dir, pooling=pooling))
    message = str(error.value)
    assert message.startswith(f"pooling={pooling!r}: {siglip_dir} has no class token") and "\n" not in message
    assert "use pooling: map (the checkpoint's own), or mean" in message


@pytest.mark.parametrize("pooling", [None, "map", "mean"])
def test_siglip_takes_its_own_pooling_or_the_mean(siglip_dir, pooling):
    check_pooling(ModelArguments(model_name_or_path=siglip_dir, pooling=pooling))


@pytest.mark.parametrize("pooling", POOLING_CHOICES)
def test_a_checkpoint_with_a_class_token_takes_every_pooling(vit_dir, pooling):
    check_pooling(ModelArguments(model_name_or_path=vit_dir, pooling=pooling))


def test_a_hub_checkpoint_not_downloaded_is_left_to_the_model(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    check_pooling(ModelArguments(model_name_or_path="google/siglip-base-patch16-224", pooling="cls",
                                 cache_dir=str(tmp_path)))  # fmt: skip


def test_a_recipe_of_cls_pooling_with_a_siglip_checkpoint_is_refused_in_parse_args(siglip_dir):
    """The user's case: a ViT recipe (pooling: cls) pointed at SigLIP, before any data (no train folder exists)."""
    with pytest.raises(RecipeError, match=r"^pooling='cls': .* has no class token"):
        parse_args(["--recipe", "digits", "--model_name_or_path", siglip_dir, "--train_dir", "/nowhere/train"])


def test_the_model_refuses_a_class_token_pooling_on_siglip_as_it_loads(siglip_dir):
    """Where the checkpoint is not on this machine before the run (a Hub id), the model's config refuses the
    override when it is read, before any training: transformers sets keyword overrides after its checks."""
    with pytest.raises(ValueError, match=r"pooling='cls' .*need the class token"):
        ViTFTForImageClassification.from_pretrained(siglip_dir, pooling="cls", num_labels=2)
    config = ViTFTConfig.from_pretrained(siglip_dir, pooling="mean")
    assert (config.pooling, config.class_token) == ("mean", False)


def test_a_refused_pooling_is_one_line_before_the_data_and_writes_nothing(siglip_dir, tmp_path, capfd):
    """The command's one line, before any data loads (the train folder does not even exist)."""
    args = ["--recipe", "digits", "--model_name_or_path", siglip_dir, "--train_dir", str(tmp_path / "nowhere"),
            "--output_dir", str(tmp_path / "out")]  # fmt: skip
    result = run_script("scripts/finetune.py", args, capfd, cwd=tmp_path)
    last = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert last.startswith("error: pooling='cls': ") and "use pooling: map" in last, last
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.parametrize("pooling", [None, "mean"])
def test_a_siglip_fine_tune_with_an_accepted_pooling_loads_in_the_tools(siglip_dir, tmp_path, capfd, pooling):
    """Unset takes the checkpoint's own attention pooling (map); mean is the other choice. Either folder loads."""
    overrides = {"num_train_epochs": 1, "max_train_samples": 32, "max_eval_samples": 16}
    recipe = write_tiny_recipe(tmp_path, model_name_or_path=siglip_dir, **overrides,
                               **({} if pooling is None else {"pooling": pooling}))  # fmt: skip
    result = run_script("scripts/finetune.py", ["--recipe", str(recipe)], capfd, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    trained = load_trained(tmp_path / "out", device="cpu")
    config = trained.model.config
    assert (config.pooling, config.class_token) == (pooling or "map", False)
    assert ViTFTForImageClassification.from_pretrained(tmp_path / "out").config.pooling == (pooling or "map")
