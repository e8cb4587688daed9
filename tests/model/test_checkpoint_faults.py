"""Damaged checkpoints of the ViT family and vit_ft folders, loaded from Python: one `ValueError` line naming the file,
the tensor (or field) and both shapes (or numbers), never a traceback through transformers' loading, never a
mismatched tensor called "newly initialised"; and a fine-tuned vit_ft folder loads whole unless `strict=False`.

The checkpoints are tiny models of transformers' own classes, saved by `save_pretrained`; one tensor is then given
another shape (safetensors' `save_file`), or one field of `config.json` another value.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    CLIPConfig,
    CLIPModel,
    CLIPVisionConfig,
    CLIPVisionModel,
    DeiTConfig,
    DeiTForImageClassificationWithTeacher,
    DeiTModel,
    Dinov2Config,
    Dinov2Model,
    SiglipVisionConfig,
    SiglipVisionModel,
)

from vit_ft import ViTFTConfig, ViTFTForImageClassification, ViTFTModel
from vit_ft.utils.cli import run_tool

from ..conftest import TINY, randomize

SIZE = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "image_size": 16, "patch_size": 4}
VISION = {**SIZE, "intermediate_size": 64}
LABELS = {"id2label": {0: "ant", 1: "bee", 2: "wasp"}, "label2id": {"ant": 0, "bee": 1, "wasp": 2}}
TEXT = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64, "vocab_size": 50}


def family_models() -> dict[str, torch.nn.Module]:
    return {
        "dinov2": Dinov2Model(Dinov2Config(**SIZE, mlp_ratio=2)),
        "deit": DeiTModel(DeiTConfig(**VISION), add_pooling_layer=False),
        "deit_teacher": DeiTForImageClassificationWithTeacher(DeiTConfig(**VISION, **LABELS)),
        "clip": CLIPVisionModel(CLIPVisionConfig(**VISION)),
        "clip_full": CLIPModel(CLIPConfig(vision_config=VISION, text_config=TEXT)),
        "siglip": SiglipVisionModel(SiglipVisionConfig(**VISION)),
    }


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, Path]:
    """Each family model saved by transformers: name -> its folder (copied before a test damages it)."""
    folders = {}
    for seed, (name, model) in enumerate(family_models().items()):
        folders[name] = tmp_path_factory.mktemp(name)
        randomize(model, seed=seed).save_pretrained(folders[name])
    return folders


def damaged_copy(saved: dict[str, Path], name: str, tmp_path: Path) -> Path:
    folder = tmp_path / name
    shutil.copytree(saved[name], folder)
    return folder


def reshape_tensor(folder: Path, key: str, shape: tuple[int, ...]) -> None:
    """Give the checkpoint's `key` another shape."""
    weights = load_file(folder / "model.safetensors")
    weights[key] = torch.zeros(shape)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})


# case -> (the checkpoint, its key, the shape it is given, how the message states the shape the config describes):
# each family's own layouts (its names for our modules, its query/key/value that we fuse, CLIP's (hidden,) class
# embedding, DINOv2's layer scale, SigLIP's packed pooling projection, DeiT's distillation token and second head).
# A tensor that implies a config field is refused naming the field (`check_sizes`), any other naming its shape.
RESHAPED = {
    "dinov2: a layer norm": ("dinov2", "encoder.layer.1.norm2.weight", (33,), "(model: [32])"),
    "dinov2: a query projection": ("dinov2", "encoder.layer.0.attention.attention.query.weight", (32, 31),
                                   "(model: [32, 32])"),
    "dinov2: a layer scale": ("dinov2", "encoder.layer.1.layer_scale1.lambda1", (16,), "(model: [32])"),
    "dinov2: the MLP's output": ("dinov2", "encoder.layer.0.mlp.fc2.weight", (32, 65), "intermediate_size is 64, "),
    "deit: the distillation token": ("deit", "embeddings.distillation_token", (1, 1, 33), "(model: [1, 1, 32])"),
    "deit: a key projection": ("deit", "encoder.layer.1.attention.attention.key.weight", (33, 32),
                               "(model: [32, 32])"),
    "deit: the teacher's second head": ("deit_teacher", "distillation_classifier.weight", (3, 31),
                                        "(model: [3, 32])"),
    "clip: a value projection": ("clip", "encoder.layers.0.self_attn.v_proj.weight", (32, 33), "(model: [32, 32])"),
    "clip: the pre-norm": ("clip", "pre_layrnorm.weight", (31,), "(model: [32])"),
    "clip: the class embedding": ("clip", "embeddings.class_embedding", (33,), "hidden_size is 32, "),
    "clip (image-text): an output projection": ("clip_full", "vision_model.encoder.layers.1.self_attn.out_proj.weight",
                                                (32, 31), "(model: [32, 32])"),
    "siglip: the pooling projection": ("siglip", "head.attention.in_proj_weight", (97, 32), "(model: [96, 32])"),
    "siglip: the pooling query": ("siglip", "head.probe", (1, 1, 33), "(model: [1, 1, 32])"),
    "siglip: a position table of another width": ("siglip", "embeddings.position_embedding.weight", (16, 33),
                                                  "(model: [16, 32])"),
    "siglip: a patch projection": ("siglip", "embeddings.patch_embedding.weight", (32, 3, 4, 5),
                                   "patch_size is (4, 4), "),
}  # fmt: skip


def load(folder: Path) -> torch.nn.Module:
    has_head = "ForImageClassification" in json.loads((folder / "config.json").read_text())["architectures"][0]
    return (ViTFTForImageClassification if has_head else ViTFTModel).from_pretrained(folder)


@pytest.mark.parametrize("case", list(RESHAPED))
def test_a_reshaped_family_tensor_is_one_line_naming_file_tensor_and_shapes(saved, tmp_path, case):
    name, key, shape, described = RESHAPED[case]
    folder = damaged_copy(saved, name, tmp_path)
    reshape_tensor(folder, key, shape)
    with pytest.raises(ValueError) as raised:
        load(folder)
    message = str(raised.value)
    assert "\n" not in message and f"{folder}/model.safetensors" in message, message
    assert f"{key} {list(shape)}" in message and described in message, message


@pytest.mark.parametrize("case", ["clip: a value projection", "dinov2: a layer norm"])
def test_the_command_line_says_it_in_one_line_without_traceback(saved, tmp_path, capfd, case):
    name, key, shape, _ = RESHAPED[case]
    folder = damaged_copy(saved, name, tmp_path)
    reshape_tensor(folder, key, shape)
    capfd.readouterr()
    with pytest.raises(SystemExit) as exited:
        run_tool(lambda argv: ViTFTModel.from_pretrained(argv[0]), [str(folder)])
    err = capfd.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert exited.value.code == 1 and len(errors) == 1 and "Traceback" not in err, err
    assert key in errors[0] and str(list(shape)) in errors[0]


def test_the_families_load_as_before(saved):
    """The check finds nothing wrong in a whole checkpoint of each family (parity: test_families.py)."""
    for name in saved:
        model = load(saved[name])
        assert model.loading_report.newly_initialized == [], name


# family -> (where the vision tower's fields are in config.json: top level or "vision_config")
HEADS = {"dinov2": None, "deit": None, "clip": None, "clip_full": "vision_config", "siglip": None}


@pytest.mark.parametrize("name", list(HEADS))
def test_a_head_count_that_does_not_divide_the_width_is_one_line(saved, tmp_path, name):
    folder = damaged_copy(saved, name, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    fields = config[HEADS[name]] if HEADS[name] else config
    fields["num_attention_heads"] = 5
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError) as raised:
        load(folder)
    where = f"{HEADS[name]}." if HEADS[name] else ""
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"{folder}/config.json: "), message
    assert f"{where}num_attention_heads=5 does not divide {where}hidden_size=32" in message, message


# ---- a mismatch the header cannot show (a state dict, or the caller's own config) --------------------------------


def tiny_state(**overrides) -> tuple[ViTFTConfig, dict[str, torch.Tensor]]:
    config = ViTFTConfig(**{**TINY, **overrides})
    return config, randomize(ViTFTModel(config)).state_dict()


def test_a_mismatched_state_dict_tensor_is_one_line_not_newly_initialised():
    config, state = tiny_state()
    state["layers.1.norm1.weight"] = torch.ones(TINY["hidden_size"] + 1)
    with pytest.raises(ValueError) as raised:
        ViTFTModel.from_pretrained(None, config=config, state_dict=state)
    message = str(raised.value)
    assert "\n" not in message and "layers.1.norm1.weight has shape [33], but the model needs [32]" in message
    assert "ignore_mismatched_sizes=True" in message


def test_ignore_mismatched_sizes_reports_a_reinitialised_tensor_never_as_newly_initialised():
    config, state = tiny_state()
    state["layers.1.norm1.weight"] = torch.ones(TINY["hidden_size"] + 1)
    model = ViTFTModel.from_pretrained(None, config=config, state_dict=state, ignore_mismatched_sizes=True)
    report = model.loading_report
    assert report.mismatched == {"layers.1.norm1.weight": ((33,), (32,))}
    assert report.newly_initialized == [] and "layers.1.norm1.weight" not in report.loaded
    assert "newly initialised" not in str(report) and "reinitialised layers.1.norm1.weight" in str(report)


# ---- a fine-tuned vit_ft folder loads whole ------------------------------------------------------------------------

REMOVED = "vit.layers.1.mlp.fc2.weight"


@pytest.fixture
def finetuned(tmp_path) -> Path:
    """A tiny vit_ft classifier (3 labels) saved by save_pretrained."""
    config = ViTFTConfig(**TINY, **LABELS)
    randomize(ViTFTForImageClassification(config)).save_pretrained(tmp_path / "finetuned")
    return tmp_path / "finetuned"


def remove_tensor(folder: Path, key: str) -> None:
    weights = load_file(folder / "model.safetensors")
    del weights[key]
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})


@pytest.mark.parametrize("removed", [REMOVED, "classifier.weight"])
@pytest.mark.parametrize("cls", [ViTFTForImageClassification, ViTFTModel])
def test_a_finetuned_folder_missing_a_tensor_is_refused_naming_it(finetuned, removed, cls):
    remove_tensor(finetuned, removed)
    if cls is ViTFTModel and removed == "classifier.weight":  # a base model has no head: nothing is missing
        assert cls.from_pretrained(finetuned).loading_report.newly_initialized == []
        return
    shown = removed if cls is ViTFTForImageClassification else removed.removeprefix("vit.")
    with pytest.raises(ValueError) as raised:
        cls.from_pretrained(finetuned)
    message = str(raised.value)
    assert "\n" not in message, message
    assert message.startswith(f"{finetuned}/model.safetensors lacks tensors the model needs: {shown};"), message
    assert "strict=False" in message


def test_strict_false_loads_it_newly_initialised_and_says_so(finetuned):
    remove_tensor(finetuned, REMOVED)
    model, info = ViTFTForImageClassification.from_pretrained(finetuned, strict=False, output_loading_info=True)
    assert info["missing_keys"] == {REMOVED}
    assert model.loading_report.newly_initialized == [REMOVED.removeprefix("vit.")]


@pytest.mark.parametrize(
    "arguments, new",
    [
        ({"num_labels": 5}, ["classifier.weight", "classifier.bias"]),  # other labels: a new head
        ({"pooling": "map"}, "attn_pool."),  # a pooling head the folder did not have
    ],
)
def test_what_the_callers_arguments_add_is_new_as_before(finetuned, arguments, new):
    model = ViTFTForImageClassification.from_pretrained(finetuned, **arguments)
    fresh = model.loading_report.newly_initialized
    assert fresh == new if isinstance(new, list) else fresh and all(k.startswith(new) for k in fresh)


def test_a_saved_backbone_and_a_hub_backbone_get_a_new_head_silently(hf_backbone_dir, tmp_path):
    randomize(ViTFTModel(ViTFTConfig(**TINY))).save_pretrained(tmp_path / "backbone")
    for source in (tmp_path / "backbone", hf_backbone_dir):
        model = ViTFTForImageClassification.from_pretrained(source, num_labels=4)
        assert model.loading_report.head == "new"
        assert model.loading_report.newly_initialized == ["classifier.weight", "classifier.bias"]


def test_a_state_dict_with_an_attention_projection_of_another_shape_is_one_line():
    """transformers' ViT layout as a state dict (no header to check first): one line naming the fused tensor,
    where transformers' loading would raise after its table."""
    from transformers import ViTConfig, ViTModel

    state = ViTModel(ViTConfig(**TINY), add_pooling_layer=False).state_dict()
    state["encoder.layer.0.attention.attention.key.weight"] = torch.zeros(33, 32)
    with pytest.raises(ValueError) as raised:
        ViTFTModel.from_pretrained(None, config=ViTFTConfig(**TINY), state_dict=state)
    message = str(raised.value)
    assert "\n" not in message and message.startswith("a state dict: "), message
    assert "layers.0.attention.qkv.weight" in message, message
