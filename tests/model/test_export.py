"""Sharing formats: our folder with its code (trust_remote_code) and the plain transformers ViT export."""

import copy
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import ViTForImageClassification, ViTImageProcessorPil, pipeline

from vit_ft import ViTFTConfig, ViTFTForImageClassification
from vit_ft.kernels import kernelize
from vit_ft.model.export import export_to_transformers

from ..conftest import WITHOUT_VIT_FT

pytestmark = pytest.mark.smoke  # also run on the oldest versions of the tested range (.ci/run)

# Runs in a fresh interpreter in which `import vit_ft` fails, as on a machine without the package.
CLEAN_PROCESS = WITHOUT_VIT_FT + textwrap.dedent(
    """
    import json, sys
    import torch
    from transformers import AutoModelForImageClassification
    folder, pixels_path, out_path = sys.argv[1:4]
    model = AutoModelForImageClassification.from_pretrained(folder, trust_remote_code=True).eval()
    assert "vit_ft" not in sys.modules
    try:
        import vit_ft  # noqa: F401
        raise SystemExit("vit_ft should not be importable")
    except ImportError:
        pass
    with torch.no_grad():
        inputs = torch.load(pixels_path)  # pixels, or NaFlex's three inputs by name
        logits = (model(**inputs) if isinstance(inputs, dict) else model(inputs)).logits
    json.dump({"cls": type(model).__module__ + "." + type(model).__name__, "logits": logits.tolist(),
               "id2label": model.config.id2label}, open(out_path, "w"))
    """
)


@pytest.fixture(scope="module")
def finetuned(hf_classifier_dir):
    """A classifier moved to a higher, non-square resolution with a non-trivial head, as after fine-tuning."""
    model = ViTFTForImageClassification.from_pretrained(hf_classifier_dir, image_size=(24, 32))
    with torch.no_grad():
        model.classifier.weight.normal_(generator=torch.Generator().manual_seed(0))
    return model


@pytest.mark.parametrize("kernels", ["1", "0"], ids=["kernels-on", "kernels-off"])
def test_saved_folder_loads_with_remote_code_in_a_clean_process(finetuned, tmp_path, kernels):
    """The folder's code is the model alone (no kernels, no loading code) and runs without vit_ft; a model saved
    with the CPU kernels swapped in (and the switch on or off) saves the same folder."""
    folder = tmp_path / "model"
    (kernelize(copy.deepcopy(finetuned)) if kernels == "1" else finetuned).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    assert (
        config["auto_map"]["AutoModelForImageClassification"] == "modeling_vit_ft.ViTFTForImageClassification"
    )
    assert {p.name for p in folder.glob("*.py")} == {
        "modeling_vit_ft.py",
        "configuration_vit_ft.py",
        "pos_embed.py",
        "rotary.py",
        "inputs.py",
        "norms.py",
        "naflex.py",
        "knn_head.py",
        "prompts.py",
        "sizes.py",
    }
    pixels = torch.randn(2, 3, 24, 32)
    out = run_in_clean_process(folder, pixels, tmp_path, kernels)
    assert out["cls"].startswith("transformers_modules.") and out["cls"].endswith(
        "ViTFTForImageClassification"
    )
    assert out["id2label"] == {"0": "ant", "1": "bee", "2": "wasp"}
    with torch.no_grad():
        expected = finetuned(pixels).logits
    assert (torch.tensor(out["logits"]) - expected).abs().max().item() <= 1e-5


def run_in_clean_process(folder, pixels: torch.Tensor | dict, tmp_path, kernels: str = "0") -> dict:
    """CLEAN_PROCESS on the saved `folder` and `pixels`: its output (class, logits, labels)."""
    torch.save(pixels, tmp_path / "pixels.pt")
    env_cache = {
        "HF_MODULES_CACHE": str(tmp_path / "modules"),
        "HF_HUB_OFFLINE": "1",
        "VIT_FT_KERNELS": kernels,
    }
    result = subprocess.run(
        [sys.executable, "-c", CLEAN_PROCESS, str(folder), str(tmp_path / "pixels.pt"), str(tmp_path / "out.json")],
        cwd=tmp_path, env={**_base_env(), **env_cache}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((tmp_path / "out.json").read_text())


@pytest.mark.long
def test_family_options_load_in_a_clean_process(tmp_path):
    """The newer family options (DINOv3's rotary positions, registers and gated MLP; MAE's fc_norm; AIMv2's
    RMSNorm, bias-free layers and pooling head) run from a saved folder's code alone: rotary.py, norms.py and
    inputs.py travel with it."""
    from ..conftest import TINY, randomize

    options = (
        {"rope_theta": 100.0, "num_register_tokens": 2, "layerscale_value": 1.0, "mlp_type": "swiglu",
         "pooling": "mean", "fc_norm": True},
        {"norm_type": "rmsnorm", "patch_norm": True, "proj_bias": False, "mlp_bias": False, "qkv_bias": False,
         "class_token": False, "no_embed_class": True, "pooling": "attn"},
    )  # fmt: skip
    pixels = torch.randn(2, 3, 20, 28)
    for index, option in enumerate(options):
        model = randomize(ViTFTForImageClassification(ViTFTConfig(**TINY, **option, num_labels=3)), seed=4)
        model.save_pretrained(tmp_path / f"model{index}")
        out = run_in_clean_process(tmp_path / f"model{index}", pixels, tmp_path)
        with torch.no_grad():
            expected = model(pixels).logits
        assert (torch.tensor(out["logits"]) - expected).abs().max().item() <= 1e-5


def test_naflex_inputs_run_in_a_clean_process(tmp_path):
    """A NaFlex batch (patches, mask, spatial_shapes) runs from a saved folder's code alone: naflex.py travels."""
    from ..conftest import TINY, randomize

    naflex = {"class_token": False, "no_embed_class": True, "pooling": "map", "max_num_patches": 12}
    config = ViTFTConfig(**TINY, **naflex, num_labels=3)
    model = randomize(ViTFTForImageClassification(config), seed=5)
    model.save_pretrained(tmp_path / "model")
    patch = config.patch_hw[0] * config.patch_hw[1] * 3
    inputs = {"pixel_values": torch.randn(2, 12, patch), "spatial_shapes": torch.tensor([[2, 6], [3, 3]]),
              "pixel_attention_mask": torch.tensor([[1] * 12, [1] * 9 + [0] * 3])}  # fmt: skip
    out = run_in_clean_process(tmp_path / "model", inputs, tmp_path)
    with torch.no_grad():
        expected = model(**inputs).logits
    assert (torch.tensor(out["logits"]) - expected).abs().max().item() <= 1e-5


def test_transformers_export_loads_in_plain_pipeline(finetuned, tmp_path):
    folder = export_to_transformers(finetuned, tmp_path / "hf")
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "vit" and config["image_size"] == [24, 32] and "auto_map" not in config
    assert config["id2label"] == {"0": "ant", "1": "bee", "2": "wasp"}
    processor = json.loads((folder / "preprocessor_config.json").read_text())
    assert processor["size"] == {"height": 24, "width": 32}

    reference = ViTForImageClassification.from_pretrained(folder).eval()
    pixels = torch.randn(2, 3, 24, 32)
    with torch.no_grad():
        assert (reference(pixels).logits - finetuned(pixels).logits).abs().max().item() <= 1e-5

    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (50, 70, 3), dtype=np.uint8))
    classifier = pipeline("image-classification", model=str(folder))
    scores = classifier(image, top_k=None, function_to_apply="none")
    inputs = ViTImageProcessorPil.from_pretrained(folder)(image, return_tensors="pt")
    with torch.no_grad():
        ours = finetuned(inputs["pixel_values"]).logits[0]
    for entry in scores:
        assert abs(entry["score"] - ours[finetuned.config.label2id[entry["label"]]].item()) <= 1e-5


def test_export_refuses_mean_pooling(hf_classifier_dir, tmp_path):
    model = ViTFTForImageClassification.from_pretrained(hf_classifier_dir, pooling="mean")
    with pytest.raises(ValueError, match="pooling='mean'"):
        export_to_transformers(model, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def _base_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
