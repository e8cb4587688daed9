"""`method: vpt` (VPT's prompt tokens, `model/prompts.py`): the fine-tune's model has the prompts and the head
trainable and nothing else (tokens x hidden, x blocks when deep, + head), the keys' checks; a real fine-tune with
its clean-process reload, predict and ONNX export is `long`."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import ViTModel

from vit_ft import ViTFTForImageClassification
from vit_ft.arguments.fields import ModelArguments
from vit_ft.arguments.prompt_arguments import VPT_TOKENS
from vit_ft.tools.trained import load_model
from vit_ft.training.lora import count_parameters
from vit_ft.training.model import build_model

from ..cli_runner import run_script
from ..conftest import randomize, tiny_hf_config, write_tiny_recipe
from ..model.test_export import run_in_clean_process

pytestmark = pytest.mark.smoke  # also run on the oldest versions of the tested range (.ci/run)

NAMES = ["a", "b", "c"]


@pytest.fixture(scope="module")
def backbone(tmp_path_factory):
    folder = tmp_path_factory.mktemp("backbone")
    randomize(ViTModel(tiny_hf_config())).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("deep", [False, True], ids=["shallow", "deep"])
def test_prompts_and_head_are_all_that_trains(backbone, deep):
    args = ModelArguments(model_name_or_path=str(backbone), method="vpt", vpt_tokens=5, vpt_deep=deep)
    model, _ = build_model(args, NAMES)
    config = model.config
    assert (config.vpt_tokens, config.vpt_deep) == (5, deep)
    layers = config.num_hidden_layers if deep else 1
    head = config.hidden_size * len(NAMES) + len(NAMES)
    assert count_parameters(model)[0] == 5 * config.hidden_size * layers + head
    trainable = {name for name, param in model.named_parameters() if param.requires_grad}
    assert trainable == {"vit.prompts.tokens", "classifier.weight", "classifier.bias"}
    plain = ViTFTForImageClassification.from_pretrained(backbone, num_labels=len(NAMES)).state_dict()
    ours = model.state_dict()
    for name, tensor in plain.items():  # the backbone as the checkpoint holds it
        if not name.startswith("classifier."):
            torch.testing.assert_close(ours[name], tensor, rtol=0, atol=0)


def test_the_default_length_and_keys_of_another_method():
    assert ModelArguments(model_name_or_path="x", method="vpt").vpt_tokens == VPT_TOKENS
    for keys, words in [({"method": "lora", "vpt_tokens": 5}, "vpt_tokens set VPT's prompt tokens, not method: lora"),
                        ({"method": "full", "vpt_deep": True}, "vpt_deep set VPT's prompt tokens, not method: full"),
                        ({"method": "vpt", "vpt_tokens": 0}, "vpt_tokens")]:  # fmt: skip
        with pytest.raises(ValueError) as error:
            ModelArguments(model_name_or_path="x", **keys)
        assert words in str(error.value) and "\n" not in str(error.value)


@pytest.mark.long  # a real fine-tune, a clean process, predict and ONNX export: CI's own step
def test_vpt_fine_tunes_reloads_predicts_and_exports(tmp_path, capfd):
    recipe = write_tiny_recipe(tmp_path, method="vpt", vpt_tokens=4, vpt_deep=True, learning_rate=0.01, num_train_epochs=1)
    result = run_script("scripts/finetune.py", ["--recipe", recipe], capfd, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "VPT: " in result.stdout + result.stderr
    out = tmp_path / "out"
    assert json.loads((out / "vit_ft_run.json").read_text())["method"] == "vpt"
    model = load_model(out)
    assert model.config.vpt_tokens == 4 and model.config.vpt_deep
    plain = ViTFTForImageClassification.from_pretrained(tmp_path / "backbone", num_labels=10)  # frozen backbone
    torch.testing.assert_close(model.vit.layers[1].mlp.fc2.weight, plain.vit.layers[1].mlp.fc2.weight, rtol=0, atol=0)
    fresh = ViTFTForImageClassification(model.config).vit.prompts.tokens
    assert model.vit.prompts.tokens.abs().max() > fresh.abs().max() / 100  # initialised, not zero
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        expected = model(pixel_values=pixels).logits
    clean = run_in_clean_process(out, pixels, tmp_path)  # transformers alone, the folder's own code
    torch.testing.assert_close(torch.tensor(clean["logits"]), expected, rtol=0, atol=1e-5)
    images = tmp_path / "digits" / "test"
    predicted = run_script("scripts/predict.py", ["--model", out, images, "--output", tmp_path / "p.csv"], capfd, cwd=tmp_path)
    assert predicted.returncode == 0, predicted.stderr[-4000:]
    exported = run_script("scripts/export.py", ["--model", out, "--output_dir", tmp_path / "onnx"], capfd, cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr[-4000:]
    assert (tmp_path / "onnx" / "model.onnx").is_file()
