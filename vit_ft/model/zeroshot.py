"""The zero-shot classifier of an image-text checkpoint (CLIP, MetaCLIP 2, SigLIP, SigLIP 2): a head built from the
class names alone, with transformers' own text tower and tokenizer from the same checkpoint.

As the CLIP paper and open_clip's `build_zero_shot_classifier` (`zero_shot_classifier.py`) build it: each class's
prompts (a template set filled with its name, or its own prompts from a `class_prompts` file) are encoded by the
text tower, each embedding L2-normalised, their mean normalised again; the head's rows are those class
embeddings times the checkpoint's logit scale (exp of the stored one), its bias SigLIP's logit bias (CLIP: none),
so that with one prompt per class our logits are transformers' `logits_per_image`. The image side is the vision
tower vit_ft loads (the pooled feature, through CLIP's visual projection) L2-normalised inside the head
(`knn_head.ZeroShotHead`): the normalisation stays in the saved model, which predicts, exports and demos as any.

    weights = zeroshot_weights("openai/clip-vit-base-patch16", ["cat", "dog"], templates="openai")
    install_zeroshot_head(model, weights)     # model: ViTFTForImageClassification of the same checkpoint
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..utils.progress import Progress
from .knn_head import ZeroShotHead

logger = logging.getLogger("vit_ft")

OPENAI_TEMPLATES = (
    "a bad photo of a {}.", "a photo of many {}.", "a sculpture of a {}.", "a photo of the hard to see {}.",
    "a low resolution photo of the {}.", "a rendering of a {}.", "graffiti of a {}.", "a bad photo of the {}.",
    "a cropped photo of the {}.", "a tattoo of a {}.", "the embroidered {}.", "a photo of a hard to see {}.",
    "a bright photo of a {}.", "a photo of a clean {}.", "a photo of a dirty {}.", "a dark photo of the {}.",
    "a drawing of a {}.", "a photo of my {}.", "the plastic {}.", "a photo of the cool {}.",
    "a close-up photo of a {}.", "a black and white photo of the {}.", "a painting of the {}.", "a painting of a {}.",
    "a pixelated photo of the {}.", "a sculpture of the {}.", "a bright photo of the {}.", "a cropped photo of a {}.",
    "a plastic {}.", "a photo of the dirty {}.", "a jpeg corrupted photo of a {}.", "a blurry photo of the {}.",
    "a photo of the {}.", "a good photo of the {}.", "a rendering of the {}.", "a {} in a video game.",
    "a photo of one {}.", "a doodle of a {}.", "a close-up photo of the {}.", "a photo of a {}.", "the origami {}.",
    "the {} in a video game.", "a sketch of a {}.", "a doodle of the {}.", "a origami {}.",
    "a low resolution photo of a {}.", "the toy {}.", "a rendition of the {}.", "a photo of the clean {}.",
    "a photo of a large {}.", "a rendition of a {}.", "a photo of a nice {}.", "a photo of a weird {}.",
    "a blurry photo of a {}.", "a cartoon {}.", "art of a {}.", "a sketch of the {}.", "a embroidered {}.",
    "a pixelated photo of a {}.", "itap of the {}.", "a jpeg corrupted photo of the {}.", "a good photo of a {}.",
    "a plushie {}.", "a photo of the nice {}.", "a photo of the small {}.", "a photo of the weird {}.",
    "the cartoon {}.", "art of the {}.", "a drawing of the {}.", "a photo of the large {}.",
    "a black and white photo of a {}.", "the plushie {}.", "a dark photo of a {}.", "itap of a {}.",
    "graffiti of the {}.", "a toy {}.", "itap of my {}.", "a photo of a cool {}.", "a photo of a small {}.",
    "a tattoo of the {}.",
)
SIMPLE_TEMPLATES = (
    "itap of a {}.", "a bad photo of the {}.", "a origami {}.", "a photo of the large {}.", "a {} in a video game.",
    "art of the {}.", "a photo of the small {}.",
)
# named template sets: the CLIP paper's 80 ImageNet prompts, the notebook's 7 (open_clip's SIMPLE_IMAGENET_TEMPLATES)
TEMPLATE_SETS = {"openai": OPENAI_TEMPLATES, "simple": SIMPLE_TEMPLATES, "photo": ("a photo of a {}.",)}
# model_type of a whole image-text checkpoint -> the pooling its image embedding is taken with (ours)
IMAGE_TEXT_POOLING = {"clip": "cls", "metaclip_2": "cls", "siglip": "map", "siglip2": "map"}
SIGLIP_TYPES = ("siglip", "siglip2")  # the text tower reads max_length padding, no mask, as it was trained
CLASSES_PER_BATCH = 10  # open_clip's num_classes_per_batch


@dataclass(frozen=True)
class ZeroShotWeights:
    """What the zero-shot head holds: `(num_labels, dim)` unit text embeddings, the `(dim, hidden)` visual
    projection (None for SigLIP), the logit scale (already exp) and bias, and where they came from."""

    text: torch.Tensor
    projection: torch.Tensor | None
    logit_scale: float
    logit_bias: float
    model_type: str
    prompts: int


def read_templates(value: str) -> tuple[str, ...]:
    """A named template set (`TEMPLATE_SETS`) or a text file of one template per line, each with one `{}` where
    the class name goes; ValueError naming the fix otherwise."""
    if value in TEMPLATE_SETS:
        return TEMPLATE_SETS[value]
    path = Path(value).expanduser()
    if not path.is_file():
        raise ValueError(
            f"zeroshot_templates={value!r} is neither a template set ({', '.join(TEMPLATE_SETS)}) nor a file; give "
            "one of those names or a text file with one template per line, e.g. 'a photo of a {}.'."
        )
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    bad = [line for line in lines if line.count("{}") != 1]
    if not lines or bad:
        why = f"line {bad[0]!r} has no single '{{}}'" if bad else "it holds no template"
        raise ValueError(f"{path}: {why}; each line is a template with one '{{}}' where the class name goes.")
    return tuple(lines)


def read_class_prompts(path: str, names: list[str]) -> dict[str, list[str]]:
    """A `class_prompts` JSON file: {class name: [prompt, ...]} for some or all of `names` (those prompts replace
    the templates for that class); ValueError naming an unknown class or a malformed entry."""
    try:
        prompts = json.loads(Path(path).expanduser().read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ValueError(f"class_prompts={path!r} cannot be read as JSON ({error}); give a JSON file mapping "
                         "class names to lists of prompts.") from error  # fmt: skip
    if not isinstance(prompts, dict):
        raise ValueError(f"class_prompts {path}: a JSON object mapping class names to lists of prompts is needed.")
    unknown = sorted(set(prompts) - set(names))
    if unknown:
        raise ValueError(f"class_prompts {path} names {unknown[:5]}, not classes of the data ({', '.join(names[:10])}).")
    for name, texts in prompts.items():
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t.strip() for t in texts):
            raise ValueError(f"class_prompts {path}: {name!r} needs a non-empty list of prompts (strings).")
    return prompts


def class_texts(names: list[str], templates: tuple[str, ...], prompts: dict[str, list[str]] | None = None) -> list[list[str]]:
    """Each class's prompts: its own from `prompts`, else every template filled with its name (underscores of a
    folder name read as spaces)."""
    prompts = prompts or {}
    return [list(prompts[name]) if name in prompts else [t.format(name.replace("_", " ")) for t in templates]
            for name in names]  # fmt: skip


def has_text_tower(checkpoint: str, cache_dir: str | None = None) -> bool:
    """Whether `checkpoint`'s config is a whole image-text model's (a zero-shot head can be built from it);
    False also where its config cannot be read."""
    from transformers import PretrainedConfig

    try:
        config, _ = PretrainedConfig.get_config_dict(checkpoint, cache_dir=cache_dir)
    except (OSError, ValueError):
        return False
    return config.get("model_type") in IMAGE_TEXT_POOLING


def check_local_text_tower(checkpoint: str) -> None:
    """ValueError for a local checkpoint folder without a text tower (a Hub id is read where the model is built)."""
    if Path(checkpoint).is_dir() and not has_text_tower(checkpoint):
        raise ValueError(f"{checkpoint} is a checkpoint without a text tower: a zero-shot head needs a whole "
                         "image-text checkpoint (CLIP, MetaCLIP 2, SigLIP, SigLIP 2).")  # fmt: skip


def load_image_text_model(checkpoint: str, cache_dir: str | None = None) -> tuple[Any, Any, str]:
    """transformers' whole image-text model of `checkpoint` (e.g. CLIPModel, SiglipModel) in eval mode, its
    tokenizer and `model_type`; ValueError when the checkpoint has no text tower or no tokenizer."""
    from transformers import AutoModel, AutoTokenizer, PretrainedConfig

    config, _ = PretrainedConfig.get_config_dict(checkpoint, cache_dir=cache_dir)
    model_type = config.get("model_type")
    if model_type not in IMAGE_TEXT_POOLING:
        raise ValueError(
            f"{checkpoint} is a {model_type or 'model'} checkpoint without a text tower: a zero-shot head needs a "
            f"whole image-text checkpoint ({', '.join(IMAGE_TEXT_POOLING)}), e.g. openai/clip-vit-base-patch16 or "
            "google/siglip-base-patch16-224, not a vision tower alone or a fine-tuned folder."
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(checkpoint, cache_dir=cache_dir)
    except (OSError, ValueError, TypeError) as error:
        raise ValueError(f"{checkpoint} has no tokenizer transformers can load ({error}); a zero-shot head encodes "
                         "the class names with the checkpoint's own tokenizer.") from error  # fmt: skip
    model = AutoModel.from_pretrained(checkpoint, cache_dir=cache_dir).eval()
    return model, tokenizer, model_type


def _tokenize(tokenizer: Any, texts: list[str], model_type: str, max_length: int) -> dict[str, torch.Tensor]:
    """The text tower's inputs for `texts` as it was trained on them: SigLIP padded to its length with no mask,
    CLIP padded to the longest with one."""
    if model_type in SIGLIP_TYPES:
        ids = tokenizer(texts, padding="max_length", max_length=max_length, truncation=True, return_tensors="pt")
        return {"input_ids": ids["input_ids"]}
    inputs = tokenizer(texts, padding=True, max_length=max_length, truncation=True, return_tensors="pt")
    return {key: inputs[key] for key in ("input_ids", "attention_mask") if key in inputs}


def check_texts(tokenizer: Any, names: list[str], texts: list[list[str]], max_length: int) -> None:
    """ValueError for a class name the tokenizer reads as nothing, or a prompt longer than the text tower reads
    (its end, and with it the class name or the end-of-text token, would be cut)."""
    for name, prompts in zip(names, texts, strict=True):
        if not tokenizer(name.replace("_", " "), add_special_tokens=False)["input_ids"]:
            raise ValueError(f"class name {name!r} is no token to the tokenizer (it reads as nothing); rename the "
                             "class or give its prompts in a class_prompts file.")  # fmt: skip
        for prompt in prompts:
            length = len(tokenizer(prompt)["input_ids"])
            if length > max_length:
                raise ValueError(f"prompt {prompt!r} of class {name!r} is {length} tokens; the text tower reads "
                                 f"{max_length}: shorten it (class_prompts) or the class name.")  # fmt: skip


@torch.no_grad()
def text_embeddings(model: Any, tokenizer: Any, texts: list[list[str]], model_type: str) -> torch.Tensor:
    """`(num_classes, dim)` class embeddings: each class's prompts encoded (`get_text_features`), normalised,
    averaged and normalised again (the CLIP paper's ensemble), `CLASSES_PER_BATCH` classes per forward pass."""
    max_length = model.config.text_config.max_position_embeddings
    device = next(model.parameters()).device
    rows = []
    with Progress(len(texts), "Zero-shot classes", unit="class") as progress:
        for start in range(0, len(texts), CLASSES_PER_BATCH):
            chunk = texts[start : start + CLASSES_PER_BATCH]
            flat = [prompt for prompts in chunk for prompt in prompts]
            inputs = {k: v.to(device) for k, v in _tokenize(tokenizer, flat, model_type, max_length).items()}
            out = model.get_text_features(**inputs)
            embeds = nn.functional.normalize((out if torch.is_tensor(out) else out.pooler_output).float(), dim=-1)
            for piece in embeds.split([len(prompts) for prompts in chunk]):  # (prompts, dim) each
                rows.append(nn.functional.normalize(piece.mean(dim=0), dim=-1))
            progress.update(len(chunk))
    return torch.stack(rows)  # (C, dim)


def zeroshot_weights(
    checkpoint: str, names: list[str], templates: str = "openai", class_prompts: str | None = None,
    cache_dir: str | None = None,
) -> ZeroShotWeights:  # fmt: skip
    """The zero-shot head of `checkpoint` for the classes `names` (in label-id order): the prompts of
    `templates` (a set's name or a file, `read_templates`) or of a `class_prompts` JSON file."""
    model, tokenizer, model_type = load_image_text_model(checkpoint, cache_dir)
    if torch.cuda.is_available():  # the text tower of a real checkpoint over 80 prompts a class: on the device
        model = model.to("cuda")
    prompts = read_class_prompts(class_prompts, names) if class_prompts else None
    texts = class_texts(names, read_templates(templates), prompts)
    check_texts(tokenizer, names, texts, model.config.text_config.max_position_embeddings)
    logger.info("Zero-shot head: %d classes, %d prompts, encoded by %s's text tower (%s).", len(names),
                sum(map(len, texts)), checkpoint, type(model).__name__)  # fmt: skip
    text = text_embeddings(model, tokenizer, texts, model_type).cpu()
    projection = getattr(model, "visual_projection", None)
    bias = getattr(model, "logit_bias", None)
    return ZeroShotWeights(
        text=text,
        projection=None if projection is None else projection.weight.detach().float().cpu(),
        logit_scale=float(model.logit_scale.detach().float().exp()),
        logit_bias=0.0 if bias is None else float(bias.detach().float().reshape(-1)[0]),
        model_type=model_type,
        prompts=sum(map(len, texts)),
    )


def install_zeroshot_head(model: nn.Module, weights: ZeroShotWeights) -> None:
    """Replace the classifier of `model` (a ViTFTForImageClassification of the same checkpoint) by the zero-shot
    head of `weights`, its config saying so (`head_type: zeroshot`, `projection_dim`); ValueError when the model
    does not pool as the checkpoint's image embedding does, or its labels are not the head's."""
    config, expected = model.config, IMAGE_TEXT_POOLING[weights.model_type]
    if config.pooling != expected or config.fc_norm:
        raise ValueError(
            f"a zero-shot head reads the image embedding of the checkpoint's own pooling ({expected}); this model "
            f"pools {config.pooling!r}{' with fc_norm' if config.fc_norm else ''}: leave pooling and fc_norm unset."
        )
    if config.num_labels != weights.text.shape[0]:
        raise ValueError(f"the model has {config.num_labels} labels, the zero-shot head {weights.text.shape[0]}.")
    parameter = next(model.parameters())
    hidden = config.hidden_size
    dim = None if weights.projection is None else weights.projection.shape[0]
    head = ZeroShotHead(hidden, config.num_labels, dim)
    with torch.no_grad():
        if weights.projection is not None:
            head.projection.weight.copy_(weights.projection)
        head.logits.weight.copy_(weights.text * weights.logit_scale)
        head.logits.bias.fill_(weights.logit_bias)
    model.classifier = head.to(device=parameter.device, dtype=parameter.dtype)
    config.head_type, config.projection_dim = "zeroshot", dim


def zeroshot_head(
    model: nn.Module, checkpoint: str, names: list[str], templates: str = "openai",
    class_prompts: str | None = None, cache_dir: str | None = None,
) -> None:  # fmt: skip
    """The fine-tune's zero-shot head (`method: zeroshot`, `head_init: zeroshot`): `model`, built from
    `checkpoint` with the labels `names`, gets the checkpoint's zero-shot classifier of those names."""
    if model.config.problem_type == "multi_label_classification":
        raise ValueError("a zero-shot head ranks the classes of one label per image (softmax over the class "
                         "texts); multi-label data takes head_init zero or another method.")  # fmt: skip
    weights = zeroshot_weights(checkpoint, names, templates, class_prompts, cache_dir)
    install_zeroshot_head(model, weights)
    logger.info("Zero-shot head installed: logit scale %.4g, bias %.4g, %s.", weights.logit_scale, weights.logit_bias,
                "the visual projection kept" if weights.projection is not None else "no visual projection")  # fmt: skip


__all__ = [
    "TEMPLATE_SETS",
    "ZeroShotWeights",
    "check_local_text_tower",
    "class_texts",
    "has_text_tower",
    "install_zeroshot_head",
    "read_class_prompts",
    "read_templates",
    "zeroshot_head",
    "zeroshot_weights",
]
