"""The zero-shot head (`model/zeroshot.py`, `head_type: zeroshot`): on tiny random CLIP, MetaCLIP 2, SigLIP and
SigLIP 2 checkpoints written by transformers' own classes, with a word-level tokenizer built here, our logits from
the class names equal transformers' `logits_per_image` for the same texts (one prompt per class; 1e-4), the
ensemble of several templates equals open_clip's construction on the reference's own `get_text_features`, a saved
zero-shot model reloads with the same logits, and the refusals are one ValueError each."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import (
    AutoTokenizer,
    CLIPConfig,
    CLIPModel,
    CLIPVisionConfig,
    CLIPVisionModel,
    MetaClip2Config,
    MetaClip2Model,
    PreTrainedTokenizerFast,
    Siglip2Config,
    Siglip2Model,
    SiglipConfig,
    SiglipModel,
)
from transformers.models.siglip2.image_processing_pil_siglip2 import Siglip2ImageProcessorPil

from vit_ft import ViTFTForImageClassification
from vit_ft.model.zeroshot import install_zeroshot_head, zeroshot_weights

from ..conftest import REPO, randomize

pytestmark = pytest.mark.smoke  # also run on the oldest versions of the tested range (.ci/run)

VISION = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
          "image_size": 16, "patch_size": 4}  # fmt: skip
SPECIAL = {"<pad>": 0, "<unk>": 1, "<s>": 2, "</s>": 3}
WORDS = ["a", "photo", "of", "the", "small", "large", ".", "ant", "bee", "wasp", "red", "insect", *"0123456789"]
MAX_TOKENS = 12  # the text tower's positions
TEXT = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
        "vocab_size": len(SPECIAL) + len(WORDS), "max_position_embeddings": MAX_TOKENS, "pad_token_id": 0,
        "bos_token_id": 2, "eos_token_id": 3}  # fmt: skip
NAMES = ["ant", "bee", "wasp"]
NAFLEX = {**{k: v for k, v in VISION.items() if k != "image_size"}, "num_patches": 16}


def tokenizer() -> PreTrainedTokenizerFast:  # also the digits' classes: tests/training/test_zeroshot_finetune.py
    """A word-level tokenizer over WORDS with CLIP's framing (<s> text </s>), built with `tokenizers`."""
    tok = Tokenizer(models.WordLevel({**SPECIAL, **{w: i + len(SPECIAL) for i, w in enumerate(WORDS)}}, "<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 2), ("</s>", 3)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", model_max_length=MAX_TOKENS)  # fmt: skip


def references() -> dict[str, torch.nn.Module]:
    return {
        "clip": CLIPModel(CLIPConfig(vision_config=VISION, text_config=TEXT, projection_dim=24)),
        "metaclip2": MetaClip2Model(MetaClip2Config(vision_config=VISION, text_config=TEXT, projection_dim=24)),
        "siglip": SiglipModel(SiglipConfig(vision_config=VISION, text_config=TEXT)),
        "siglip2": Siglip2Model(Siglip2Config(vision_config=NAFLEX, text_config=TEXT)),
    }


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, tuple[str, torch.nn.Module]]:
    out = {}
    for seed, (name, model) in enumerate(references().items()):
        folder = tmp_path_factory.mktemp(name)
        randomize(model, seed=seed).save_pretrained(folder)
        tokenizer().save_pretrained(folder)
        out[name] = (str(folder), model)
    return out


def pixel_inputs(name: str) -> dict[str, torch.Tensor]:
    """Three images: square pixels, or (SigLIP 2) transformers' NaFlex patches of several aspect ratios."""
    rng = np.random.default_rng(0)
    if name != "siglip2":
        return {"pixel_values": torch.as_tensor(rng.standard_normal((3, 3, 16, 16)), dtype=torch.float32)}
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in [(20, 40), (32, 16), (16, 16)]]
    return dict(Siglip2ImageProcessorPil(patch_size=4, max_num_patches=20)(images=images, return_tensors="pt"))


def zeroshot_model(folder: str, templates: str = "photo", **kwargs) -> ViTFTForImageClassification:
    model = ViTFTForImageClassification.from_pretrained(folder, id2label=dict(enumerate(NAMES))).eval()
    install_zeroshot_head(model, zeroshot_weights(folder, NAMES, templates, **kwargs))
    return model


@pytest.mark.parametrize("name", list(references()))
def test_zeroshot_logits_equal_transformers_logits_per_image(checkpoints, tmp_path, name):
    folder, reference = checkpoints[name]
    single = tmp_path / "templates.txt"
    single.write_text("a {} .\n")
    model = zeroshot_model(folder, str(single))
    texts = [f"a {n} ." for n in NAMES]
    siglip = name.startswith("siglip")
    # the tokenizer transformers loads for the checkpoint (SigLIP 2's own class reads the same tokenizer.json)
    loaded = AutoTokenizer.from_pretrained(folder)
    text = loaded(texts, padding="max_length" if siglip else True, max_length=MAX_TOKENS, truncation=True,
                  return_tensors="pt")
    text = {"input_ids": text["input_ids"]} if siglip else dict(text)  # SigLIP: no mask, as it was trained
    pixels = pixel_inputs(name)
    with torch.no_grad():
        expected = reference(**text, **pixels).logits_per_image  # (images, classes)
        ours = model(**pixels).logits
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)
    assert model.config.head_type == "zeroshot"


def test_template_ensemble_is_open_clips(checkpoints):
    """Several templates: each prompt's embedding normalised, the class mean normalised, times the logit scale."""
    folder, reference = checkpoints["clip"]
    templates = ("a photo of a {}.", "a photo of the small {}.", "a photo of the large {}.")
    path = f"{folder}/templates.txt"
    with open(path, "w") as handle:
        handle.write("\n".join(templates))
    model = zeroshot_model(folder, path)
    pixels = pixel_inputs("clip")["pixel_values"]
    with torch.no_grad():
        rows = []
        for name in NAMES:
            text = tokenizer()([t.format(name) for t in templates], padding=True, return_tensors="pt")
            embeds = torch.nn.functional.normalize(reference.get_text_features(**text).pooler_output, dim=-1)
            rows.append(torch.nn.functional.normalize(embeds.mean(0), dim=-1))
        image = torch.nn.functional.normalize(reference.get_image_features(pixel_values=pixels).pooler_output, dim=-1)
        expected = reference.logit_scale.exp() * image @ torch.stack(rows).T
        ours = model(pixels).logits
    torch.testing.assert_close(ours, expected, atol=1e-4, rtol=0)


def test_a_saved_zeroshot_model_reloads_as_any_model(checkpoints, tmp_path):
    folder, _ = checkpoints["siglip"]
    model = zeroshot_model(folder, class_prompts=None)
    model.save_pretrained(tmp_path / "zs")
    again = ViTFTForImageClassification.from_pretrained(tmp_path / "zs").eval()
    pixels = pixel_inputs("siglip")["pixel_values"]
    with torch.no_grad():
        torch.testing.assert_close(again(pixels).logits, model(pixels).logits, atol=1e-6, rtol=0)
    assert again.config.head_type == "zeroshot" and again.loading_report.newly_initialized == []


def test_class_prompts_replace_the_templates_of_their_class(checkpoints, tmp_path):
    folder, reference = checkpoints["clip"]
    prompts = tmp_path / "prompts.json"
    prompts.write_text('{"bee": ["a red insect ."]}')
    weights = zeroshot_weights(folder, NAMES, "photo", class_prompts=str(prompts))
    with torch.no_grad():
        text = tokenizer()(["a red insect .", "a photo of a wasp."], padding=True, return_tensors="pt")
        expected = torch.nn.functional.normalize(reference.get_text_features(**text).pooler_output, dim=-1)
    torch.testing.assert_close(weights.text[1:], expected, atol=1e-5, rtol=0)


def test_refusals_are_one_line_each(checkpoints, tmp_path):
    folder, _ = checkpoints["clip"]
    vision_only = tmp_path / "vision"
    CLIPVisionModel(CLIPVisionConfig(**VISION)).save_pretrained(vision_only)
    with pytest.raises(ValueError, match="without a text tower"):
        zeroshot_weights(str(vision_only), NAMES)
    with pytest.raises(ValueError, match="reads as nothing"):
        zeroshot_weights(folder, ["ant", "  "])
    long = tmp_path / "long.txt"
    long.write_text("a photo of a photo of a photo of a photo of the small {} .\n")
    with pytest.raises(ValueError, match="the text tower reads 12"):
        zeroshot_weights(folder, NAMES, str(long))
    with pytest.raises(ValueError, match="neither a template set"):
        zeroshot_weights(folder, NAMES, "no-such-set")
    model = ViTFTForImageClassification.from_pretrained(folder, id2label=dict(enumerate(NAMES)), pooling="mean")
    with pytest.raises(ValueError, match="checkpoint's own pooling"):
        install_zeroshot_head(model, zeroshot_weights(folder, NAMES, "photo"))


HUB_ZEROSHOT = """
import sys, torch
from vit_ft import ViTFTForImageClassification
from vit_ft.model.zeroshot import zeroshot_head
repo, pixels, out = sys.argv[1], torch.load(sys.argv[2]), sys.argv[3]
names = ["ant", "bee", "wasp"]
model = ViTFTForImageClassification.from_pretrained(repo, id2label=dict(enumerate(names))).eval()
zeroshot_head(model, repo, names, "photo")
with torch.no_grad():
    torch.save(model(pixels).logits, out)
"""


@pytest.mark.long  # a fresh interpreter against the local Hub: about 10 s
def test_a_hub_checkpoint_id_loads_its_text_tower_through_the_hub(checkpoints, tmp_path):
    import subprocess
    import sys

    from ..fake_hub import FakeHub

    folder, reference = checkpoints["clip"]
    pixels = pixel_inputs("clip")["pixel_values"]
    torch.save(pixels, tmp_path / "pixels.pt")
    with FakeHub() as hub:
        hub.add_repo("tester/clip-tiny", Path(folder))
        result = subprocess.run(
            [sys.executable, "-c", HUB_ZEROSHOT, "tester/clip-tiny", str(tmp_path / "pixels.pt"), str(tmp_path / "out.pt")],
            cwd=tmp_path, env={**hub.env(tmp_path, token=None), "PYTHONPATH": str(REPO)}, capture_output=True,
            text=True, timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        fetched = {path for _, repo, path in hub.downloads if repo == "tester/clip-tiny"}
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= fetched
        assert not hub.unexpected
    text = AutoTokenizer.from_pretrained(folder)([f"a photo of a {n}." for n in NAMES], padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = reference(**text, pixel_values=pixels).logits_per_image
    torch.testing.assert_close(torch.load(tmp_path / "out.pt"), expected, atol=1e-4, rtol=0)


@pytest.mark.long  # an ONNX export and a clean interpreter: about 10 s
def test_a_zeroshot_folder_exports_to_onnx_and_loads_without_vit_ft(checkpoints, tmp_path):
    pytest.importorskip("onnxruntime")
    from vit_ft.tools.export.onnx import FP32_TOLERANCE, export_model

    from .test_export import run_in_clean_process

    model = zeroshot_model(checkpoints["clip"][0])
    _, difference = export_model(model, tmp_path / "model.onnx")
    assert difference <= FP32_TOLERANCE
    model.save_pretrained(tmp_path / "model")
    pixels = pixel_inputs("clip")["pixel_values"]
    with torch.no_grad():
        expected = model(pixels).logits
    out = run_in_clean_process(tmp_path / "model", pixels, tmp_path)  # trust_remote_code, no vit_ft imported
    assert (torch.tensor(out["logits"]) - expected).abs().max().item() <= 1e-5
