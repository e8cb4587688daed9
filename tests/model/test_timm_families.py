"""The ViT family in timm's layout (`vit_*_dinov2`, `vit_*_reg4_dinov2`, `deit_*_distilled_*`, `vit_*_clip_*`,
`vit_*_siglip_*`): transformers' reference weights renamed to timm's keys (as timm's own checkpoint filters write
them) load through our from_pretrained and give the transformers reference's numbers, native and resampled."""

from __future__ import annotations

import json
import re

import pytest
import torch
from safetensors.torch import load_file, save_file

from vit_ft import ViTFTForImageClassification, ViTFTModel

from .test_families import NATIVE, RESAMPLED, reference_outputs

# transformers on-disk block names -> timm's `blocks.N.*`
BLOCK = {
    "layernorm_before": "norm1", "layernorm_after": "norm2", "layer_norm1": "norm1", "layer_norm2": "norm2",
    "norm1": "norm1", "norm2": "norm2", "attention.output.dense": "attn.proj", "self_attn.out_proj": "attn.proj",
    "intermediate.dense": "mlp.fc1", "output.dense": "mlp.fc2", "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2",
    "layer_scale1.lambda1": "ls1.gamma", "layer_scale2.lambda1": "ls2.gamma",
    "mlp.weights_in": "mlp.fc1", "mlp.weights_out": "mlp.fc2",  # DINOv2's SwiGLU is timm's SwiGLUPacked
}  # fmt: skip
OUTSIDE = {
    "embeddings.cls_token": "cls_token", "embeddings.distillation_token": "dist_token",
    "embeddings.register_tokens": "reg_token", "embeddings.position_embeddings": "pos_embed",
    "embeddings.patch_embeddings.projection.weight": "patch_embed.proj.weight",
    "embeddings.patch_embeddings.projection.bias": "patch_embed.proj.bias",
    "embeddings.patch_embedding.weight": "patch_embed.proj.weight",
    "embeddings.patch_embedding.bias": "patch_embed.proj.bias",
    "layernorm.weight": "norm.weight", "layernorm.bias": "norm.bias",
    "post_layernorm.weight": "norm.weight", "post_layernorm.bias": "norm.bias",
    "pre_layrnorm.weight": "norm_pre.weight", "pre_layrnorm.bias": "norm_pre.bias",
    "cls_classifier.weight": "head.weight", "cls_classifier.bias": "head.bias",
    "distillation_classifier.weight": "head_dist.weight", "distillation_classifier.bias": "head_dist.bias",
    "head.probe": "attn_pool.latent", "head.attention.out_proj.weight": "attn_pool.proj.weight",
    "head.attention.out_proj.bias": "attn_pool.proj.bias", "head.layernorm.weight": "attn_pool.norm.weight",
    "head.layernorm.bias": "attn_pool.norm.bias", "head.mlp.fc1.weight": "attn_pool.mlp.fc1.weight",
    "head.mlp.fc1.bias": "attn_pool.mlp.fc1.bias", "head.mlp.fc2.weight": "attn_pool.mlp.fc2.weight",
    "head.mlp.fc2.bias": "attn_pool.mlp.fc2.bias",
}  # fmt: skip
QKV = re.compile(r"(attention\.attention\.(query|key|value)|self_attn\.(q|k|v)_proj)$")
LAYER = re.compile(r"^encoder\.layers?\.(\d+)\.(.+)\.(weight|bias|lambda1)$")


def to_timm(folder: str) -> dict[str, torch.Tensor]:
    """A transformers family checkpoint's tensors under timm's VisionTransformer keys."""
    sd = {re.sub(r"^(deit|dinov2|dinov2_with_registers|vision_model)\.", "", k): v for k, v in load_file(
        f"{folder}/model.safetensors").items()}  # fmt: skip
    out, qkv = {}, {}
    for key, tensor in sd.items():
        if key in OUTSIDE:
            out[OUTSIDE[key]] = tensor
        elif key == "embeddings.class_embedding":  # CLIP
            out["cls_token"] = tensor.reshape(1, 1, -1)
        elif key == "embeddings.position_embedding.weight":  # CLIP, SigLIP: (positions, hidden)
            out["pos_embed"] = tensor[None]
        elif key.startswith("head.attention.in_proj_"):  # SigLIP: timm's AttentionPoolLatent q / kv
            kind, hidden = key.rsplit("_", 1)[1], tensor.shape[0] // 3
            out[f"attn_pool.q.{kind}"], out[f"attn_pool.kv.{kind}"] = tensor[:hidden], tensor[hidden:]
        elif match := LAYER.match(key):
            index, name, kind = match.groups()
            if (role := QKV.search(name)) is not None:
                qkv.setdefault((index, kind), {})[(role.group(2) or role.group(3))[0]] = tensor
            else:
                suffix = "" if kind == "lambda1" else f".{kind}"
                out[f"blocks.{index}.{BLOCK[name if kind != 'lambda1' else f'{name}.lambda1']}{suffix}"] = (
                    tensor
                )
    for (index, kind), parts in qkv.items():
        out[f"blocks.{index}.attn.qkv.{kind}"] = torch.cat([parts["q"], parts["k"], parts["v"]])
    if "reg_token" in out:  # timm's _convert_dinov2: no_embed_class, the class position folded into the token
        out["cls_token"] = out["cls_token"] + out["pos_embed"][:, :1]
        out["pos_embed"] = out["pos_embed"][:, 1:]
    return {k: v.contiguous() for k, v in out.items()}


# reference name -> (timm architecture, global_pool)
TIMM_NAMES = {
    "dinov2_model": ("vit_small_patch14_dinov2", "token"),
    "dinov2_registers": ("vit_small_patch14_reg4_dinov2", "token"),
    "dinov2_swiglu": ("vit_giant_patch14_dinov2", "token"),
    "deit_teacher": ("deit_base_distilled_patch16_224", "token"),
    "clip_vision": ("vit_base_patch16_clip_quickgelu_224", "token"),
    "siglip_vision": ("vit_base_patch16_siglip_224", "map"),
}


@pytest.fixture(scope="module")
def timm_folders(checkpoints, tmp_path_factory) -> dict[str, str]:
    out = {}
    for name, (architecture, pool) in TIMM_NAMES.items():
        folder = tmp_path_factory.mktemp(f"timm_{name}")
        source, reference = checkpoints[name]
        labels = reference.config.num_labels if name == "deit_teacher" else 0
        size = reference.config.hidden_size
        config = {
            "architecture": architecture,
            "num_classes": labels,
            "global_pool": pool,
            "model_args": {
                "img_size": NATIVE,
                "patch_size": 4,
                "embed_dim": size,
                "depth": 2,
                "num_heads": 4,
            },
            "pretrained_cfg": {"input_size": [3, NATIVE, NATIVE], "mean": [0.5] * 3, "std": [0.5] * 3},
        }
        # the references' MLP: 64 for hidden 32; timm's SwiGLU ratio gives fc1's packed width, 2 * 88
        config["model_args"]["mlp_ratio"] = 176 / 32 if "swiglu" in name else 2.0
        if name == "deit_teacher":
            config["label_names"] = [reference.config.id2label[i] for i in range(labels)]
        (folder / "config.json").write_text(json.dumps(config))
        save_file(to_timm(source), folder / "model.safetensors")
        out[name] = str(folder)
    return out


@pytest.mark.parametrize("size", [NATIVE, RESAMPLED])
@pytest.mark.parametrize("name", list(TIMM_NAMES))
def test_timm_layout_gives_the_transformers_numbers(checkpoints, timm_folders, name, size):
    _, reference = checkpoints[name]
    pixels = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(size))
    expected = reference_outputs(name, reference, pixels)
    cls = ViTFTForImageClassification if "logits" in expected else ViTFTModel
    model = cls.from_pretrained(timm_folders[name]).eval()
    assert model.loading_report.newly_initialized == [] and model.loading_report.source_format.startswith(
        "timm"
    )
    with torch.no_grad():
        out = model(pixels)
    for key, value in expected.items():
        torch.testing.assert_close(getattr(out, key), value, atol=1e-5, rtol=0, msg=f"{name} {key}")


def test_timm_dinov2_giant_hub_config_reads_its_swiglu_size():
    """timm's Hub config for DINOv2 giant states no model_args: the name gives its size, the packed fc1 its MLP."""
    from vit_ft.model.timm_format import timm_config_fields

    shapes = {"cls_token": (1, 1, 1536), "pos_embed": (1, 1370, 1536), "norm.weight": (1536,),
              "patch_embed.proj.weight": (1536, 3, 14, 14), "patch_embed.proj.bias": (1536,),
              **{f"blocks.{i}.mlp.fc1.weight": (8192, 1536) for i in range(40)},
              "blocks.0.mlp.fc2.weight": (1536, 4096), "blocks.0.attn.proj.bias": (1536,),
              "blocks.0.ls1.gamma": (1536,)}  # fmt: skip
    config = {"architecture": "vit_giant_patch14_dinov2.lvd142m", "num_classes": 0, "global_pool": "token",
              "pretrained_cfg": {"input_size": [3, 518, 518]}}  # fmt: skip
    fields = timm_config_fields(config, shapes, "timm/vit_giant_patch14_dinov2.lvd142m")
    assert {k: fields[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads")} == {
        "hidden_size": 1536, "num_hidden_layers": 40, "num_attention_heads": 24}  # fmt: skip
    assert (fields["mlp_type"], fields["intermediate_size"], fields["image_size"]) == ("swiglu", 4096, 518)
