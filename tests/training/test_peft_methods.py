"""The peft methods of `--method`: trainable parameters against each method's formula, merged == unmerged,
save -> reload (the head included), bad input as one line; the real fine-tunes and the clean-process reload are
`long` (CI's own step)."""

import json
import shutil
import sys
import textwrap

import pytest
import torch
from peft import PeftModel

from vit_ft import ViTFTForImageClassification, kernels
from vit_ft.arguments.fields import LORA_KEY_METHODS, PEFT_METHODS, ModelArguments
from vit_ft.tools.trained import load_model
from vit_ft.training.lora import apply_lora, count_parameters, merge_lora
from vit_ft.training.peft_methods import PEFT_METHOD_TABLE

from ..cli_runner import run_script
from ..conftest import WITHOUT_VIT_FT, randomize, tiny_ft_config, write_tiny_recipe

pytestmark = pytest.mark.smoke  # also run on the oldest versions of the tested range (.ci/run)

LABELS = 3


def base_model(seed: int = 0) -> ViTFTForImageClassification:
    return randomize(ViTFTForImageClassification(tiny_ft_config(num_labels=LABELS)), seed)


def trained(method: str, **keys) -> PeftModel:
    """A tiny model with `method`'s adapters, every trainable tensor (the head's copy too) moved off its start, as
    after training: most methods start as the identity, which would hide a merge or reload that drops them."""
    model = apply_lora(base_model(), ModelArguments(model_name_or_path="x", method=method, **keys))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(torch.randn(param.shape, generator=generator) * 0.05)
    return model.eval()


def formula(method: str, config) -> int:
    """Trainable parameters by each method's paper, from the model's sizes and the method's defaults (rank r on
    the fused qkv projection: in = hidden, out = 3 hidden), plus the head (hidden x labels + labels)."""
    hidden, layers, inner = config.hidden_size, config.num_hidden_layers, config.intermediate_size
    head = hidden * LABELS + LABELS
    r = PEFT_METHOD_TABLE[method].rank or ModelArguments.lora_r
    adapters = {
        "lora": layers * r * (hidden + 3 * hidden),  # A (r x in) and B (out x r)
        "dora": layers * (r * (hidden + 3 * hidden) + 3 * hidden),  # LoRA's and a magnitude per output
        "vera": layers * (r + 3 * hidden),  # the scaling vectors d (r) and b (out); A and B frozen, shared
        "ia3": layers * (3 * hidden + inner),  # l_k, l_v (here q too: qkv is fused) and l_ff on fc2's input
        "ln_tuning": (2 * layers + 1) * 2 * hidden,  # every LayerNorm's weight and bias, the final one included
    }
    return adapters[method] + head


@pytest.mark.parametrize("method", ["lora", "dora", "vera", "ia3", "ln_tuning"])
def test_trainable_parameters_follow_the_methods_formula(method):
    model = apply_lora(base_model(), ModelArguments(model_name_or_path="x", method=method))
    trainable, total = count_parameters(model)
    assert trainable == formula(method, model.config)
    assert total > trainable
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    assert any("modules_to_save" in name and "classifier" in name for name in names)  # the head, in full


@pytest.mark.parametrize("method", PEFT_METHODS)
def test_merged_equals_unmerged_and_reload_brings_the_head(method, tmp_path):
    model = trained(method)
    trainable, _ = count_parameters(model)
    assert trainable > LABELS * 33  # the adapters besides the head
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits = model(pixel_values=pixels).logits
        merged = merge_lora(model)
        assert type(merged) is ViTFTForImageClassification
        assert merged.state_dict().keys() == base_model().state_dict().keys()  # a plain model's, head unwrapped
        torch.testing.assert_close(merged(pixel_values=pixels).logits, logits, rtol=0, atol=1e-5)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert config["modules_to_save"] == ["classifier"]
    fresh = base_model()  # the base's head re-drawn: the adapter's must replace it
    torch.nn.init.normal_(fresh.classifier.weight, std=1.0)
    reloaded = PeftModel.from_pretrained(fresh, tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(pixel_values=pixels).logits, logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("keys", "words"),
    [
        ({"method": "vera", "lora_r": 8}, "lora_r set LoRA's adapters, not method: vera"),
        ({"method": "dora", "peft_r": 8}, "not read by method: dora"),
        ({"method": "full", "peft_target_modules": "qkv"}, "not method: full"),
        ({"method": "loha", "peft_r": 0}, "peft_r"),
        ({"method": "lora", "lora_r": 0}, "lora_r"),
        ({"method": "prefix"}, "method='prefix' is not supported"),
    ],
)
def test_keys_of_another_method_and_rank_zero_are_one_line(keys, words):
    with pytest.raises(ValueError, match=None) as error:
        ModelArguments(model_name_or_path="x", **keys)
    assert words in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("method", "keys", "words"),
    [
        ("dora", {"lora_target_modules": "norm1"}, "adapts Linear, Conv2d layers, but target 'norm1' is a LayerNorm"),
        ("ln_tuning", {"peft_target_modules": "qkv"}, "target 'qkv' is a Linear"),
        ("vera", {"peft_target_modules": "query"}, "no module of the model is named query"),
    ],
)
def test_targets_the_method_cannot_adapt_are_one_line(method, keys, words):
    from vit_ft.utils.cli import USER_ERRORS, error_line

    with pytest.raises(ValueError) as error:
        apply_lora(base_model(), ModelArguments(model_name_or_path="x", method=method, **keys))
    assert words in str(error.value) and "\n" not in str(error.value)
    assert isinstance(error.value, USER_ERRORS)  # what the command prints as its one line (utils.cli.run_tool)
    assert error_line(error.value).startswith(f"error: method {method}")


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--method", "vera", "--lora_r", "8"], "lora_r set LoRA's adapters, not method: vera"),
        (["--method", "dora", "--peft_target_modules", "qkv"], "not read by method: dora"),
        (["--method", "oft", "--peft_r", "0"], "peft_r"),
        (["--method", "adalora", "--lora_r", "0"], "lora_r"),
    ],
)
def test_bad_method_keys_on_the_command_line_are_one_error_line(flags, words):
    from vit_ft.arguments.checks import RecipeError
    from vit_ft.arguments.recipes import build_plan
    from vit_ft.utils.cli import error_line

    with pytest.raises(RecipeError) as error:  # before any model or data, with the method defaults merged
        build_plan(["--dataset_name", "a/b", "--model_name_or_path", "x", *flags])
    line = error_line(error.value)
    assert words in line and line.startswith("error: ") and "\n" not in line


@pytest.mark.parametrize("method", ["adalora", "lora"])
def test_training_step_on_the_cpu_kernels_equals_plain_torch(method, monkeypatch):
    """AdaLoRA adds its branch in place (`result +=`) onto the kernels' Linear output: the same gradients as torch."""
    grads = []
    for on in ("1", "0"):
        monkeypatch.setenv(kernels.KERNELS_ENV, on)
        model = kernels.kernelize(base_model())
        torch.manual_seed(0)  # the adapters' random start, the same in both
        model = apply_lora(model, ModelArguments(model_name_or_path="x", method=method)).eval()  # no dropout draws
        model(pixel_values=torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(5))).logits.sum().backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys()
    for name, grad in grads[0].items():
        torch.testing.assert_close(grad, grads[1][name], rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize(("resume", "best", "words"), [
    ("checkpoint-4", False, "method adalora cannot --resume"),
    (None, True, "method adalora cannot load_best_model_at_end"),
    (None, False, None),
])  # fmt: skip
def test_adalora_refuses_what_its_checkpoints_cannot_give_back(resume, best, words):
    from types import SimpleNamespace

    from vit_ft.training.lora import AdaLoraCallback, peft_callbacks

    model = trained("adalora")
    if words is None:
        assert [type(c) for c in peft_callbacks(model, SimpleNamespace(load_best_model_at_end=best), resume)] == [
            AdaLoraCallback
        ]
        assert peft_callbacks(trained("lora"), SimpleNamespace(load_best_model_at_end=True), resume) == []
        return
    with pytest.raises(ValueError, match=words):
        peft_callbacks(model, SimpleNamespace(load_best_model_at_end=best), resume)


def test_every_method_has_one_row_with_a_source():
    assert set(PEFT_METHOD_TABLE) == set(PEFT_METHODS) and set(LORA_KEY_METHODS) <= set(PEFT_METHODS)
    assert all(row.source and row.learning_rate > 0 for row in PEFT_METHOD_TABLE.values())


# ---- long: a clean process, and a real fine-tune per method ----------------------------------------------------

CLEAN_RELOAD = WITHOUT_VIT_FT + textwrap.dedent(
    """
    import json, sys
    import torch
    from peft import PeftModel
    from transformers import AutoModelForImageClassification
    base, pixels_path, out_path, *adapters = sys.argv[1:]
    pixels, out = torch.load(pixels_path), {}
    for adapter in adapters:
        model = AutoModelForImageClassification.from_pretrained(base, trust_remote_code=True)
        model = PeftModel.from_pretrained(model, adapter).eval()
        with torch.no_grad():
            out[adapter] = model(pixel_values=pixels).logits.tolist()
    assert "vit_ft" not in sys.modules
    json.dump(out, open(out_path, "w"))
    """
)


@pytest.mark.long  # a fresh interpreter with transformers + peft alone (~10 s of imports): CI's own step
def test_every_adapter_reloads_in_a_clean_process_with_the_same_logits(tmp_path):
    import subprocess

    base = tmp_path / "base"
    base_model().save_pretrained(base)  # with its model code: the clean process loads it as remote code
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(3))
    torch.save(pixels, tmp_path / "pixels.pt")
    expected = {}
    for method in PEFT_METHODS:
        model = trained(method)
        model.save_pretrained(tmp_path / method)
        with torch.no_grad():
            expected[str(tmp_path / method)] = model(pixel_values=pixels).logits
    script = tmp_path / "reload.py"
    script.write_text(CLEAN_RELOAD)
    args = [sys.executable, script, base, tmp_path / "pixels.pt", tmp_path / "out.json", *expected]
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    got = json.loads((tmp_path / "out.json").read_text())
    for adapter, logits in expected.items():
        torch.testing.assert_close(torch.tensor(got[adapter]), logits, rtol=0, atol=1e-5)


@pytest.mark.long  # a real fine-tune per method, then predict and ONNX export from its folder: CI's own step
@pytest.mark.parametrize("method", PEFT_METHODS)
def test_method_fine_tunes_predicts_and_exports_from_its_folder(method, tmp_path, capfd):
    recipe = write_tiny_recipe(tmp_path, method=method, learning_rate=0.01, num_train_epochs=1,
                               load_best_model_at_end=False)  # fmt: skip (AdaLoRA refuses it)
    result = run_script("scripts/finetune.py", ["--recipe", recipe], capfd, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    out = tmp_path / "out"
    assert json.loads((out / "vit_ft_run.json").read_text())["method"] == method
    card = (out / "README.md").read_text()
    assert f"- Fine-tuning: {'LoRA' if method == 'lora' else method}" in card  # the card names the method
    adapter_config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert adapter_config["modules_to_save"] == ["classifier"]
    pixels = torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        unmerged = load_model(out / "adapter")(pixel_values=pixels).logits
        merged = load_model(out)(pixel_values=pixels).logits
    torch.testing.assert_close(merged, unmerged, rtol=0, atol=1e-5)
    images = tmp_path / "digits" / "test"
    predicted = run_script("scripts/predict.py", ["--model", out / "adapter", images, "--output", tmp_path / "p.csv"],
                           capfd, cwd=tmp_path)  # fmt: skip
    assert predicted.returncode == 0, predicted.stderr[-4000:]
    exported = run_script("scripts/export.py", ["--model", out, "--output_dir", tmp_path / "onnx"], capfd, cwd=tmp_path)
    assert exported.returncode == 0, exported.stderr[-4000:]
    assert (tmp_path / "onnx" / "model.onnx").is_file()


@pytest.mark.long  # two fine-tunes per method: CI's own step
@pytest.mark.parametrize("method", ["dora", "vera", "ia3", "ssf", "vpt"])
def test_resume_of_a_method_is_bit_exact(method, tmp_path):
    """An uninterrupted run and its checkpoint-4 (mid-epoch 1 of 2) resumed in a fresh folder end with the same
    metrics, losses, merged weights and adapter (AdaLoRA refuses to resume: its own test)."""
    from .test_resume import final_run, finetune

    first = tmp_path / "first"
    first.mkdir()
    recipe = write_tiny_recipe(first, method=method, learning_rate=0.01, save_strategy="steps", save_steps=4,
                               save_total_limit=None, hidden_dropout_prob=0.1, max_train_samples=96)  # fmt: skip
    finetune(first, recipe)
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(first / "out" / "checkpoint-4", resumed / "checkpoint-4")
    finetune(first, recipe, "--output_dir", str(resumed), "--resume")
    assert final_run(resumed) == final_run(first / "out")
    if method not in ("ssf", "vpt"):  # folded into / part of a plain model: no adapter
        adapter = "adapter/adapter_model.safetensors"
        assert (resumed / adapter).read_bytes() == (first / "out" / adapter).read_bytes()
