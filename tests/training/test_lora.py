"""LoRA: the recipe path, the adapter and merged outputs, and merged == unmerged logits."""

import json

import pytest
import torch

from vit_ft import ViTFTForImageClassification, kernels
from vit_ft.arguments.fields import ModelArguments
from vit_ft.kernels import PackedBitsDropout
from vit_ft.tools.trained import load_model
from vit_ft.training.lora import apply_lora, count_parameters, merge_lora

from ..cli_runner import run_script
from ..conftest import randomize, tiny_ft_config, write_tiny_recipe

pytestmark = pytest.mark.smoke  # also run on the oldest versions of the tested range (.ci/run)


def lora_model(targets: str = "attention") -> torch.nn.Module:
    model = randomize(ViTFTForImageClassification(tiny_ft_config(num_labels=3)))
    peft_model = apply_lora(
        model, ModelArguments(model_name_or_path="x", use_lora=True, lora_target_modules=targets)
    )
    with torch.no_grad():  # LoRA B starts at zero; give it values so that merging has something to do
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.1)
    return peft_model.eval()


@pytest.mark.parametrize(
    ("targets", "adapted"), [("attention", {"qkv"}), ("attention+mlp", {"qkv", "proj", "fc1", "fc2"})]
)
def test_targets_and_trainable_parameters(targets, adapted):
    model = lora_model(targets)
    wrapped = {name.split(".")[-2] for name, _ in model.named_modules() if name.endswith("lora_A")}
    assert wrapped == adapted
    trainable, total = count_parameters(model)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert all("lora_" in n or "classifier" in n for n in names)
    assert any("classifier" in n for n in names)  # the new head is trained in full (modules_to_save)
    assert 0 < trainable < total


def test_apply_lora_uses_packed_bits_dropout_with_the_configured_rate():
    dropouts = [m for m in lora_model().modules() if isinstance(m, torch.nn.Dropout) and m.p > 0]
    assert dropouts and all(type(m) is PackedBitsDropout and m.p == 0.1 for m in dropouts)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.03])
def test_packed_bits_dropout_is_a_dropout(p, monkeypatch):
    monkeypatch.setenv(kernels.KERNELS_ENV, "1")  # its own path on any CPU (auto takes it on AMD only)
    dropout = PackedBitsDropout(p).train()
    x = torch.randn(250_001, dtype=torch.float64).abs() + 1.0  # odd size: the last 64-bit draw is part-used
    torch.manual_seed(0)
    out = dropout(x)
    kept = out != 0
    effective = round(p * 65536) / 65536
    n = x.numel()
    assert abs(kept.double().mean().item() - (1 - effective)) < 5 * (effective * (1 - effective) / n) ** 0.5
    torch.testing.assert_close(out[kept], x[kept] / (1 - effective), rtol=1e-12, atol=0)
    # independent across elements and positions: the four 16-bit lanes of a draw drop at the same rate
    lanes = kept[: n - n % 4].view(-1, 4).double().mean(0)
    assert (lanes - (1 - effective)).abs().max().item() < 5 * (effective * 4 / n) ** 0.5
    torch.manual_seed(0)
    assert torch.equal(dropout(x), out)  # seeded
    assert not torch.equal(dropout(x), out)  # fresh mask each call
    # gradient: the same mask, the same scale
    leaf = x.clone().requires_grad_()
    torch.manual_seed(1)
    result = dropout(leaf)
    result.sum().backward()
    torch.testing.assert_close(leaf.grad, (result != 0).double() / (1 - effective))
    assert torch.equal(dropout.eval()(x), x)


def test_merged_equals_unmerged_and_survives_save_and_reload(tmp_path):
    model = lora_model()
    merged = merge_lora(model)
    assert type(merged) is ViTFTForImageClassification
    pixels = torch.randn(3, 3, 16, 16)
    with torch.no_grad():
        unmerged_logits = model(pixel_values=pixels).logits
        assert (merged(pixels).logits - unmerged_logits).abs().max().item() <= 1e-5
    # merging a copy leaves the adapter model intact
    assert any("lora_A" in n for n, _ in model.named_parameters())
    merged.save_pretrained(tmp_path / "merged")
    reloaded = ViTFTForImageClassification.from_pretrained(tmp_path / "merged")
    with torch.no_grad():
        assert (reloaded(pixels).logits - unmerged_logits).abs().max().item() <= 1e-5


def test_lora_recipe_writes_adapter_and_merged_model(tmp_path, capfd):
    recipe = write_tiny_recipe(tmp_path, use_lora=True, learning_rate=0.01)
    result = run_script("scripts/finetune.py", ["--recipe", recipe], capfd, cwd=tmp_path)  # in this process
    assert result.returncode == 0, result.stderr[-4000:]
    assert "trainable of" in result.stdout + result.stderr  # the log states trainable vs total parameters
    out = tmp_path / "out"
    assert (out / "adapter" / "adapter_config.json").is_file() and (out / "model.safetensors").is_file()
    adapter_config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert adapter_config["modules_to_save"] == ["classifier"] and adapter_config["r"] == 16
    assert json.loads((out / "vit_ft_run.json").read_text())["lora"] is True

    adapter_model = load_model(out / "adapter")
    merged_model = load_model(out)
    assert type(adapter_model).__name__ == "PeftModel" and type(merged_model) is ViTFTForImageClassification
    pixels = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        a, b = adapter_model(pixel_values=pixels).logits, merged_model(pixel_values=pixels).logits
    assert (a - b).abs().max().item() <= 1e-5
    assert torch.count_nonzero(merged_model.classifier.weight) > 0  # the head was trained and saved
