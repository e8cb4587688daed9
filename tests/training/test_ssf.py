"""SSF (`method: ssf`): the trainable scales and shifts against the paper's count, folded == unfolded (with the CPU
kernels' fused MLP too), the folded model a plain one; a real fine-tune with predict and ONNX export is `long`."""

import json

import pytest
import torch

from vit_ft import ViTFTForImageClassification, kernels
from vit_ft.training.lora import count_parameters
from vit_ft.training.ssf import ScaleShift, apply_ssf, merge_ssf

from ..cli_runner import run_script
from ..conftest import randomize, tiny_ft_config, write_tiny_recipe

pytestmark = pytest.mark.smoke  # also run on the oldest versions of the tested range (.ci/run)

LABELS = 3


def ssf_model(**config) -> torch.nn.Module:
    model = randomize(ViTFTForImageClassification(tiny_ft_config(num_labels=LABELS, **config)))
    torch.manual_seed(0)
    model = apply_ssf(model)
    with torch.no_grad():  # as after training: scales and shifts well away from their start
        for module in model.modules():
            if isinstance(module, ScaleShift):
                module.scale.normal_(1.0, 0.3)
                module.shift.normal_(0.0, 0.3)
    return model.eval()


def test_trainable_parameters_are_the_papers_scales_and_shifts_and_the_head():
    model = ssf_model()
    config = model.config
    hidden, inner = config.hidden_size, config.intermediate_size
    # per block: qkv (3 hidden), proj, fc1 (inner), fc2, norm1, norm2 outputs, each a scale and a shift; the final
    # norm; the head (hidden x labels + labels)
    per_block = 2 * (3 * hidden + hidden + inner + hidden + 2 * hidden)
    expected = config.num_hidden_layers * per_block + 2 * hidden + hidden * LABELS + LABELS
    assert count_parameters(model)[0] == expected
    frozen = [n for n, p in model.named_parameters() if not p.requires_grad]
    assert all(".op." in n or "embeddings" in n for n in frozen)  # the backbone's own weights, all frozen


@pytest.mark.parametrize("on", ["1", "0"], ids=["kernels-on", "kernels-off"])
def test_folded_equals_unfolded_and_is_a_plain_model(on, monkeypatch, tmp_path):
    monkeypatch.setenv(kernels.KERNELS_ENV, on)  # on: the fused GELU MLP must still call fc1's wrapper
    model = ssf_model()
    kernels.kernelize(model)
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    merged = merge_ssf(model)
    plain = ViTFTForImageClassification(model.config)
    assert merged.state_dict().keys() == plain.state_dict().keys()
    assert not any(isinstance(m, ScaleShift) for m in merged.modules())
    merged.save_pretrained(tmp_path)
    reloaded = ViTFTForImageClassification.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        logits = model(pixel_values=pixels).logits
        torch.testing.assert_close(merged(pixel_values=pixels).logits, logits, rtol=0, atol=1e-5)
        torch.testing.assert_close(reloaded(pixel_values=pixels).logits, logits, rtol=0, atol=1e-5)


def test_an_op_without_a_bias_is_left_as_it_is():
    model = ssf_model(qkv_bias=False)
    assert not any(isinstance(m.attention.qkv, ScaleShift) for m in model.vit.layers)
    assert all(isinstance(m.attention.proj, ScaleShift) for m in model.vit.layers)


@pytest.mark.long  # a real fine-tune, then predict and ONNX export from its folder: CI's own step
def test_ssf_fine_tunes_predicts_and_exports(tmp_path, capfd):
    recipe = write_tiny_recipe(tmp_path, method="ssf", learning_rate=0.01, num_train_epochs=1)
    result = run_script("scripts/finetune.py", ["--recipe", recipe], capfd, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "SSF: " in result.stdout + result.stderr
    out = tmp_path / "out"
    assert json.loads((out / "vit_ft_run.json").read_text())["method"] == "ssf"
    assert not (out / "adapter").exists()  # folded: a plain model
    predicted = run_script("scripts/predict.py", ["--model", out, tmp_path / "digits" / "test", "--output",
                                                  tmp_path / "p.csv"], capfd, cwd=tmp_path)  # fmt: skip
    assert predicted.returncode == 0, predicted.stderr[-4000:]
    exported = run_script("scripts/export.py", ["--model", out, "--output_dir", tmp_path / "onnx"], capfd, cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr[-4000:]
