"""timm ViT checkpoints: a hand-built folder in timm's Hub layout loads and matches transformers' ViT on the same
numbers; what a plain ViT cannot hold is refused; our models export to timm's layout and back unchanged."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import ViTForImageClassification

from vit_ft import ViTFTForImageClassification, ViTFTModel
from vit_ft.model.export import export_to_timm
from vit_ft.model.formats import checkpoint_normalization
from vit_ft.model.timm_format import timm_config_fields, to_timm_state_dict

from ..conftest import REPO, TINY, randomize, tiny_hf_config
from ..fake_hub import FakeHub
from .test_jax_checkpoints import hf_layer

LABELS = ["ant", "bee", "wasp"]
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def hf_reference(seed: int = 0) -> ViTForImageClassification:
    """transformers' ViT classifier with timm's LayerNorm eps (1e-6), every parameter random."""
    config = tiny_hf_config(
        layer_norm_eps=1e-6, id2label=dict(enumerate(LABELS)), label2id={n: i for i, n in enumerate(LABELS)}
    )
    return randomize(ViTForImageClassification(config), seed=seed)


def timm_state_dict_from_hf(model: ViTForImageClassification) -> dict[str, torch.Tensor]:
    """The keys and shapes timm's VisionTransformer writes (timm/models/vision_transformer.py), from transformers'
    tensors: qkv fused in query, key, value order; `pos_embed` (1, 1 + N, D) with the class slot first."""
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out = {
        "cls_token": sd["vit.embeddings.cls_token"],
        "pos_embed": sd["vit.embeddings.position_embeddings"],
        "patch_embed.proj.weight": sd["vit.embeddings.patch_embeddings.projection.weight"],
        "patch_embed.proj.bias": sd["vit.embeddings.patch_embeddings.projection.bias"],
        "norm.weight": sd["vit.layernorm.weight"],
        "norm.bias": sd["vit.layernorm.bias"],
        "head.weight": sd["classifier.weight"],
        "head.bias": sd["classifier.bias"],
    }
    for i in range(model.config.num_hidden_layers):
        for kind in ("weight", "bias"):
            qkv = [hf_layer(sd, i, role, kind) for role in ("query", "key", "value")]
            out[f"blocks.{i}.attn.qkv.{kind}"] = torch.cat(qkv)
            out[f"blocks.{i}.attn.proj.{kind}"] = hf_layer(sd, i, "out", kind)
            out[f"blocks.{i}.norm1.{kind}"] = hf_layer(sd, i, "ln1", kind)
            out[f"blocks.{i}.norm2.{kind}"] = hf_layer(sd, i, "ln2", kind)
            out[f"blocks.{i}.mlp.fc1.{kind}"] = hf_layer(sd, i, "fc1", kind)
            out[f"blocks.{i}.mlp.fc2.{kind}"] = hf_layer(sd, i, "fc2", kind)
    return {k: v.contiguous() for k, v in out.items()}


def timm_config(**overrides) -> dict:
    """timm's Hub config.json (timm.models._hub.push_to_hf_hub): the size in model_args, as TINY is no named size."""
    config = {
        "architecture": "vit_base_patch16_224",
        "num_classes": len(LABELS),
        "num_features": TINY["hidden_size"],
        "global_pool": "token",
        "label_names": LABELS,
        "model_args": {
            "img_size": TINY["image_size"],
            "patch_size": TINY["patch_size"],
            "embed_dim": TINY["hidden_size"],
            "depth": TINY["num_hidden_layers"],
            "num_heads": TINY["num_attention_heads"],
            "mlp_ratio": TINY["intermediate_size"] / TINY["hidden_size"],
        },
        "pretrained_cfg": {
            "input_size": [3, TINY["image_size"], TINY["image_size"]],
            "interpolation": "bicubic",
            "crop_pct": 0.9,
            "mean": MEAN,
            "std": STD,
            "num_classes": len(LABELS),
            "first_conv": "patch_embed.proj",
            "classifier": "head",
        },
    }
    config.update(overrides)
    return config


def write_timm_folder(path: Path, state_dict: dict[str, torch.Tensor], config: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    save_file(state_dict, path / "model.safetensors", metadata={"format": "pt"})
    return path


@pytest.fixture(scope="module")
def reference():
    return hf_reference()


@pytest.fixture(scope="module")
def timm_dir(reference, tmp_path_factory) -> Path:
    return write_timm_folder(
        tmp_path_factory.mktemp("timm"), timm_state_dict_from_hf(reference), timm_config()
    )


def pixels(height: int = 16, width: int = 16) -> torch.Tensor:
    return torch.randn(2, 3, height, width, generator=torch.Generator().manual_seed(3))


def test_timm_folder_matches_transformers_vit(reference, timm_dir):
    model = ViTFTForImageClassification.from_pretrained(timm_dir).eval()
    assert model.config.id2label == dict(enumerate(LABELS))
    assert model.config.layer_norm_eps == 1e-6 and model.config.pooling == "cls"
    assert model.loading_report.head == "kept" and "timm" in model.loading_report.source_format
    with torch.no_grad():
        diff = (model(pixels()).logits - reference(pixels()).logits).abs().max().item()
    assert diff <= 1e-5


def test_timm_backbone_matches_transformers_encoder(reference, timm_dir):
    model = ViTFTModel.from_pretrained(timm_dir).eval()
    with torch.no_grad():
        ours = model(pixels()).last_hidden_state
        theirs = reference.vit(pixels()).last_hidden_state
    assert (ours - theirs).abs().max().item() <= 1e-5
    assert set(model.loading_report.discarded) == {"classifier.weight", "classifier.bias"}


def test_timm_head_replaced_for_new_labels_and_grid_resampled(reference, timm_dir):
    model = ViTFTForImageClassification.from_pretrained(timm_dir, num_labels=5, image_size=24).eval()
    assert model.loading_report.head == "new"
    assert torch.count_nonzero(model.classifier.weight) == 0
    assert model.loading_report.resampled["embeddings.position_embeddings"] == ((4, 4), (6, 6))
    with torch.no_grad():  # the encoder is the reference's, run at the new size with interpolated positions
        ours = model.vit(pixels(24, 24)).last_hidden_state
        theirs = reference.vit(pixels(24, 24), interpolate_pos_encoding=True).last_hidden_state
    assert (ours - theirs).abs().max().item() <= 1e-4


def test_loaded_model_saves_in_our_format(timm_dir, tmp_path):
    model = ViTFTForImageClassification.from_pretrained(timm_dir).eval()
    model.save_pretrained(tmp_path / "saved")
    assert "vit.layers.0.attention.qkv.weight" in load_file(tmp_path / "saved" / "model.safetensors")
    again = ViTFTForImageClassification.from_pretrained(tmp_path / "saved").eval()
    assert again.loading_report.source_format == "vit_ft"
    with torch.no_grad():
        assert torch.equal(model(pixels()).logits, again(pixels()).logits)


def test_missing_weights_file_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(timm_config()))
    with pytest.raises(OSError, match="no model.safetensors"):
        ViTFTForImageClassification.from_pretrained(tmp_path)


def test_loaded_model_holds_every_timm_tensor_unchanged(timm_dir):
    """The renaming that loads a timm checkpoint is the exact inverse of the export's: every key, every tensor."""
    timm_sd = load_file(timm_dir / "model.safetensors")
    model = ViTFTForImageClassification.from_pretrained(timm_dir)
    assert model.loading_report.newly_initialized == [] and model.loading_report.discarded == {}
    back = to_timm_state_dict(model.state_dict(), model.config)
    assert back.keys() == timm_sd.keys()
    assert all(torch.equal(back[k], timm_sd[k]) for k in timm_sd)


def test_mean_pooling_without_fc_norm(reference, tmp_path):
    """timm's global_pool='avg' with fc_norm=False: the final norm, then the mean of the patch tokens = ours."""
    config = timm_config(global_pool="avg")
    config["model_args"].update(global_pool="avg", fc_norm=False)
    folder = write_timm_folder(tmp_path / "avg", timm_state_dict_from_hf(reference), config)
    model = ViTFTForImageClassification.from_pretrained(folder).eval()
    assert model.config.pooling == "mean"
    with torch.no_grad():
        tokens = reference.vit(pixels()).last_hidden_state
        expected = reference.classifier(tokens[:, 1:].mean(dim=1))
        assert (model(pixels()).logits - expected).abs().max().item() <= 1e-5


def test_export_to_timm_and_back_is_identical(tmp_path):
    model = ViTFTForImageClassification.from_pretrained(
        write_timm_folder(tmp_path / "src", timm_state_dict_from_hf(hf_reference(seed=4)), timm_config())
    ).eval()
    folder = export_to_timm(model, tmp_path / "timm", image_mean=MEAN, image_std=STD)
    written = json.loads((folder / "config.json").read_text())
    assert written["label_names"] == LABELS and written["pretrained_cfg"]["mean"] == MEAN
    again = ViTFTForImageClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        assert torch.equal(model(pixels()).logits, again(pixels()).logits)
    exported = load_file(folder / "model.safetensors")
    source = load_file(tmp_path / "src" / "model.safetensors")
    assert exported.keys() == source.keys() and all(torch.equal(exported[k], source[k]) for k in source)


def test_export_keeps_another_layer_norm_eps_for_vit_ft(hf_classifier_dir, tmp_path):
    """A model from a transformers checkpoint (eps 1e-12) comes back with its eps, so with identical outputs."""
    model = ViTFTForImageClassification.from_pretrained(hf_classifier_dir).eval()
    again = ViTFTForImageClassification.from_pretrained(export_to_timm(model, tmp_path / "t")).eval()
    assert again.config.layer_norm_eps == model.config.layer_norm_eps == 1e-12
    with torch.no_grad():
        assert torch.equal(model(pixels()).logits, again(pixels()).logits)


def test_normalization_comes_from_pretrained_cfg(timm_dir, hf_classifier_dir):
    assert checkpoint_normalization(timm_dir) == {"image_mean": MEAN, "image_std": STD}
    assert set(checkpoint_normalization(hf_classifier_dir)) == {
        "image_mean",
        "image_std",
        "rescale_factor",
    } or (checkpoint_normalization(hf_classifier_dir) == {})


def _extra(key: str, shape: tuple[int, ...]):
    return lambda sd, cfg: sd.update({key: torch.zeros(shape)})


def _model_arg(name: str, value):
    return lambda sd, cfg: cfg["model_args"].update({name: value})


def _fc_norm(sd, cfg):
    sd["fc_norm.weight"], sd["fc_norm.bias"] = sd.pop("norm.weight"), sd.pop("norm.bias")
    cfg.update(global_pool="avg")


# register tokens, layer scale, no_embed_class, pre_norm, attention pooling and QuickGELU load now (the family:
# tests/model/test_timm_families.py); what no member has is still refused
REFUSED = {
    "fc_norm": (_fc_norm, "after average pooling"),
    "qk norm": (_extra("blocks.0.attn.q_norm.weight", (8,)), "qk normalisation"),
    "qk_norm arg": (_model_arg("qk_norm", True), "qk_norm=True"),
    "rope arg": (_model_arg("pos_embed", "rope"), "pos_embed='rope'"),
    "unknown arg": (_model_arg("block_fn", "ParallelScalingBlock"), "block_fn"),
    "unpacked swiglu (DINOv2 repo w12)": (_extra("blocks.0.mlp.w12.weight", (128, 32)), "unpacked SwiGLU"),
    "wrong size": (_model_arg("depth", 3), "blocks"),
}


@pytest.mark.parametrize("case", list(REFUSED), ids=list(REFUSED))
def test_what_a_plain_vit_cannot_hold_is_refused(reference, tmp_path, case):
    change, message = REFUSED[case]
    state_dict, config = timm_state_dict_from_hf(reference), timm_config()
    change(state_dict, config)
    folder = write_timm_folder(tmp_path / "bad", state_dict, config)
    with pytest.raises(ValueError, match=message) as error:
        ViTFTForImageClassification.from_pretrained(folder)
    assert "\n" not in str(error.value) and str(folder) in str(error.value)


@pytest.mark.parametrize(
    "architecture, size, patch",
    [
        ("vit_base_patch16_224", "base", 16),
        ("vit_small_patch16_384", "small", 16),
        ("vit_large_patch14_clip_224", "large", 14),
    ],
)
def test_architecture_names_give_size_and_patch(architecture, size, patch):
    from vit_ft.model.sizes import VIT_SIZES

    dims = VIT_SIZES[size]
    side = int(architecture.rsplit("_", 1)[1]) // patch
    hidden, mlp = dims["hidden_size"], dims["intermediate_size"]
    shapes = {
        "cls_token": (1, 1, hidden),
        "pos_embed": (1, 1 + side * side, hidden),
        "patch_embed.proj.weight": (hidden, 3, patch, patch),
        "patch_embed.proj.bias": (hidden,),
        "norm.weight": (hidden,),
        **{f"blocks.{i}.mlp.fc1.weight": (mlp, hidden) for i in range(dims["num_hidden_layers"])},
        "blocks.0.attn.proj.bias": (hidden,),
        "blocks.0.attn.qkv.bias": (3 * hidden,),
    }
    config = {
        "architecture": architecture,
        "num_classes": 0,
        "pretrained_cfg": {"input_size": [3, side * patch, side * patch]},
    }
    fields = timm_config_fields(config, shapes, "repo")
    assert {k: fields[k] for k in dims} == dims and fields["patch_size"] == patch
    assert fields["image_size"] == side * patch and fields["num_labels"] == 0


def test_fine_tune_takes_mean_and_std_from_pretrained_cfg(timm_dir):
    """The fine-tune's model and processor (training.model.build_model), as `--model_name_or_path <timm repo>` runs it."""
    from vit_ft.arguments.fields import ModelArguments
    from vit_ft.training.model import build_model

    model, processor = build_model(ModelArguments(model_name_or_path=str(timm_dir), image_size=24), ["a", "b"])
    assert list(processor.image_mean) == MEAN and list(processor.image_std) == STD
    assert processor.size == {"height": 24, "width": 24} and model.loading_report.head == "new"


def test_export_names_a_registered_timm_architecture():
    from vit_ft import ViTFTConfig
    from vit_ft.model.timm_format import timm_config_dict

    small = timm_config_dict(ViTFTConfig.from_variant("small", image_size=384), MEAN, STD)
    assert small["architecture"] == "vit_small_patch16_384" and small["model_args"]["embed_dim"] == 384
    tiny = timm_config_dict(ViTFTConfig(**TINY, num_labels=0), MEAN, STD)
    assert tiny["architecture"] == "vit_base_patch16_224"  # a name timm has; model_args state the real size
    assert tiny["model_args"]["patch_size"] == TINY["patch_size"] and tiny["num_classes"] == 0


# A fresh interpreter pointed at the local stand-in Hub: a timm repo id loads through huggingface_hub's downloads.
HUB_LOAD = textwrap.dedent(
    """
    import sys, torch
    from vit_ft import ViTFTForImageClassification
    repo_id, pixels_path, out_path = sys.argv[1:4]
    model = ViTFTForImageClassification.from_pretrained(repo_id).eval()
    with torch.no_grad():
        torch.save({"logits": model(torch.load(pixels_path)).logits, "format": model.loading_report.source_format,
                    "labels": model.config.id2label}, out_path)
    """
)


def test_timm_hub_id_loads_through_hub_downloads(reference, timm_dir, tmp_path):
    with FakeHub() as hub:
        hub.add_repo("timm/vit_tiny_test.in1k", timm_dir)
        env = hub.env(tmp_path, token=None)
        torch.save(pixels(), tmp_path / "pixels.pt")
        result = subprocess.run(
            [sys.executable, "-c", HUB_LOAD, "timm/vit_tiny_test.in1k", str(tmp_path / "pixels.pt"), str(tmp_path / "out.pt")],
            cwd=tmp_path, env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        assert {path for _, repo, path in hub.downloads if repo == "timm/vit_tiny_test.in1k"} >= {
            "config.json",
            "model.safetensors",
        }
        assert not hub.unexpected
    out = torch.load(tmp_path / "out.pt")
    assert out["format"] == "timm vit_base_patch16_224" and out["labels"] == dict(enumerate(LABELS))
    with torch.no_grad():
        assert (out["logits"] - reference(pixels()).logits).abs().max().item() <= 1e-5


def test_position_grid_of_the_weights_wins_over_a_stated_input_size(reference, tmp_path):
    config = timm_config()
    del config["model_args"]["img_size"]
    config["pretrained_cfg"]["input_size"] = [3, 32, 32]  # e.g. a test size; the weights hold a 4x4 grid
    model = ViTFTForImageClassification.from_pretrained(
        write_timm_folder(tmp_path / "t", timm_state_dict_from_hf(reference), config)
    ).eval()
    assert model.config.image_size == TINY["image_size"] and not model.loading_report.resampled
    with torch.no_grad():
        assert (model(pixels()).logits - reference(pixels()).logits).abs().max().item() <= 1e-5


def test_the_tools_normalise_a_timm_checkpoint_as_its_pretrained_cfg_says(reference, timm_dir, tmp_path):
    """predict / evaluate / the demo load a timm folder with its mean and std (no preprocessor_config.json)."""
    from PIL import Image

    from vit_ft.tools.predict.run import predict_files
    from vit_ft.tools.trained import load_trained

    classifier = load_trained(timm_dir, device="cpu")
    assert (classifier.preprocessing.mean, classifier.preprocessing.std) == (tuple(MEAN), tuple(STD))
    image = tmp_path / "x.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (16, 16, 3), dtype=np.uint8)).save(image)
    (prediction,) = predict_files(classifier, [image], top_k_labels=len(LABELS), progress=False)
    pixels = torch.from_numpy(np.asarray(Image.open(image), dtype=np.float32) / 255).permute(2, 0, 1)
    pixels = (pixels - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]
    expected = reference(pixel_values=pixels[None]).logits.softmax(-1)[0]
    assert prediction.label == LABELS[int(expected.argmax())]
    np.testing.assert_allclose(
        prediction.scores, expected.sort(descending=True).values.detach().numpy(), atol=1e-5
    )
