"""The tools on each member of the ViT family: a saved folder of each family's tiny config is read by
`load_trained` and runs through predict, inspect (attention distance, rollout) and the few-shot features, with
the family's prefix tokens (class, distillation, registers, or none) handled where patches are read; the newer
members (DINOv3, MAE's layout, AIMv2) also through ONNX and onnxruntime."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

from vit_ft.model.modeling_vit_ft import ViTFTConfig, ViTFTForImageClassification
from vit_ft.tools.explain.rollout import attention_rollout, rollout_maps
from vit_ft.tools.fewshot.features import pre_logits
from vit_ft.tools.inspect.run import attention_distances, run_inspection
from vit_ft.tools.predict.run import run_prediction
from vit_ft.tools.trained import load_trained

from ..model.conftest import FAMILY_CONFIGS


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    folder = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    paths = []
    for i in range(3):
        path = folder / f"{i}.png"
        Image.fromarray(rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)).save(path)
        paths.append(path)
    return paths


def saved_family(name: str, folder) -> ViTFTForImageClassification:
    torch.manual_seed(0)
    config = ViTFTConfig(**FAMILY_CONFIGS[name], num_labels=3, id2label={0: "a", 1: "b", 2: "c"})
    model = ViTFTForImageClassification(config).eval()
    torch.nn.init.normal_(model.classifier.weight, std=0.5)  # a head that separates, not the zero head
    model.save_pretrained(folder)
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "ViTImageProcessor", "size": {"height": 16, "width": 16}, "do_resize": True,
        "do_normalize": True, "image_mean": [0.5] * 3, "image_std": [0.5] * 3, "resample": 2,
    }))  # fmt: skip
    return model


def test_rollout_reads_the_patches_after_every_prefix_token():
    """With uniform attention the rollout is uniform over the patches whatever the prefix; with a class token
    that attends only to patch 0 (behind a distillation token), all flows from patch 0."""
    for prefix in (0, 1, 2, 3):
        tokens = prefix + 16
        uniform = [torch.full((1, 4, tokens, tokens), 1 / tokens) for _ in range(2)]
        rollout = attention_rollout(uniform, num_prefix_tokens=prefix)
        assert rollout.shape == (1, 16)
        torch.testing.assert_close(rollout, torch.full((1, 16), 1 / 16))
    tokens = 2 + 16  # class + distillation token (DeiT)
    looking = torch.eye(tokens)
    looking[0] = 0
    looking[0, 2] = 1.0  # the class token attends to the first patch only
    rollout = attention_rollout([looking.expand(1, 4, tokens, tokens)], num_prefix_tokens=2)
    assert rollout[0].argmax() == 0 and rollout[0, 0] > 0.99


@pytest.mark.parametrize("name", sorted(FAMILY_CONFIGS))
def test_tools_run_on_each_family(name, tmp_path, images):
    model = saved_family(name, tmp_path / "model")
    trained = load_trained(tmp_path / "model")
    assert type(trained.model.config).__name__ == "ViTFTConfig"
    assert trained.model.config.num_prefix_tokens == model.config.num_prefix_tokens
    pixels = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(trained.model(pixel_values=pixels).logits, model(pixel_values=pixels).logits)
        maps = rollout_maps(trained.model, pixels)
        features = pre_logits(trained.model, pixels)
    assert maps.shape == (2, 4, 4) and torch.allclose(maps.sum(dim=(1, 2)), torch.ones(2))
    width = 2 * 32 if model.config.pooling == "cls+mean" else 32
    assert features.shape == (2, width)  # what the head reads: DINOv2's is class token and patch mean

    summary = run_prediction(tmp_path / "model", images, tmp_path / "preds.csv", figure=None, progress=False)
    rows = (tmp_path / "preds.csv").read_text().splitlines()
    assert summary["rows"] == 3 and summary["errors"] == 0 and len(rows) == 4  # header + one row per image
    distances, used = attention_distances(trained, images, progress=False)
    assert distances.shape == (2, 4) and used == 3 and torch.isfinite(distances).all()
    # the whole inspect command for the prefixes 2 (DeiT), 0 (SigLIP), registers without a position table
    # (DINOv3's rotary positions: Figure 7's similarity panel is skipped), MAE's fc_norm and AIMv2
    if name not in ("deit", "siglip", "dinov3", "mae", "aimv2"):
        return
    run_inspection(tmp_path / "model", tmp_path / "inspect", images=images, progress=False)
    numbers = json.loads((tmp_path / "inspect" / "inspection.json").read_text())
    assert (tmp_path / "inspect" / "attention_rollout.png").is_file()
    rotary = name == "dinov3"
    assert (tmp_path / "inspect" / "position_similarity.png").is_file() != rotary
    assert ("skipped" in numbers["position_similarity"]) == rotary
    assert np.array(numbers["attention_distance"]["mean_distance"]).shape == (2, 4)  # (layers, heads)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dinov3", "mae", "aimv2"])
def test_onnx_export_of_the_newer_members_matches_pytorch_in_onnxruntime(name, tmp_path):
    """DINOv3's rotary positions (computed from the input's grid inside the graph), MAE's fc_norm and AIMv2's
    RMSNorm and pooling head export with a dynamic height and width, and onnxruntime gives PyTorch's logits at
    sizes the trace never saw."""
    pytest.importorskip("onnxruntime")
    from vit_ft.tools.export.onnx import export_model
    from vit_ft.tools.export.onnx_runtime import OnnxClassifier

    model = saved_family(name, tmp_path / "model")
    trace, difference = export_model(model, tmp_path / "model.onnx")
    dynamic = trace.dynamic_size
    assert dynamic and difference <= 1e-4
    graph = OnnxClassifier(tmp_path / "model.onnx")
    for height, width in ((16, 16), (20, 28), (32, 12)):
        pixels = torch.randn(3, 3, height, width, generator=torch.Generator().manual_seed(height))
        with torch.no_grad():
            expected = model(pixel_values=pixels).logits
        assert (graph.logits(pixels) - expected).abs().max().item() <= 1e-4, (height, width)


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("dinov3", "no image-classification class for DINOv3's rotary ViT"),
        ("aimv2", "no image-classification class for AIMv2's RMSNorm ViT"),
        ("mae", "fc_norm=True (it needs False)"),
    ],
)
def test_push_stages_the_newer_members_with_their_code_and_says_why(name, why, tmp_path):
    """No transformers class holds DINOv3, AIMv2 or MAE's fc_norm layout: the push stages vit_ft's code (the
    model file and every module it imports) and the card says why; the staged folder gives the same logits."""
    from transformers import AutoModelForImageClassification

    from vit_ft.tools.export.hub import stage_for_hub

    model = saved_family(name, tmp_path / "model")
    staged = stage_for_hub(tmp_path / "model", tmp_path / "staged", f"me/{name}")
    assert {"modeling_vit_ft.py", "rotary.py", "norms.py", "inputs.py"} <= {p.name for p in staged.glob("*.py")}
    card = (staged / "README.md").read_text()
    assert "- Format: vit_ft" in card and why in card
    remote = AutoModelForImageClassification.from_pretrained(staged, trust_remote_code=True).eval()
    pixels = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(remote(pixels).logits, model(pixels).logits, atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    """train/ and test/ folders of the labels a, b, c: four and two random 20x20 images each."""
    root, rng = tmp_path_factory.mktemp("labelled"), np.random.default_rng(1)
    for split, count in (("train", 4), ("test", 2)):
        for label in "abc":
            (root / split / label).mkdir(parents=True)
            for i in range(count):
                image = rng.integers(0, 255, (20, 20, 3), dtype=np.uint8)
                Image.fromarray(image).save(root / split / label / f"{i}.png")
    return root


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dinov3", "aimv2", "mae"])
def test_evaluate_and_fewshot_run_on_the_newer_members(name, tmp_path, labelled):
    """evaluate (at another resolution than the saved one: rotary positions, resampled tables) and the few-shot
    probe on frozen features of the pooling each member uses (fc_norm after MAE's mean, AIMv2's head)."""
    from vit_ft.tools.evaluate.run import run_evaluation
    from vit_ft.tools.fewshot.run import FewShotOptions, run_fewshot

    saved_family(name, tmp_path / "model")
    metrics = run_evaluation(tmp_path / "model", tmp_path / "eval", data_dir=labelled / "test", image_size=20)
    assert metrics["num_images"] == 6 and metrics["image_size"] == [20, 20]
    assert (tmp_path / "eval" / "report.md").is_file()
    options = FewShotOptions(shots=(1, 2), seeds=1, bf16="false", progress=False)
    record = run_fewshot(tmp_path / "model", labelled, tmp_path / "fewshot", options)
    assert record["feature_dim"] == 32 and [r["shots"] for r in record["results"]] == [1, 2]
