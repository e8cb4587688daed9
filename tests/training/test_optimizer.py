"""vit_ft.training.optimizer: every parameter group's learning rate and weight decay against BEiT/timm's formula,
the no-weight-decay names, LoRA's wrapped names, and the Trainer's scheduler keeping the layer scales."""

import pytest
import torch
from peft import LoraConfig, get_peft_model

from vit_ft import ViTFTForImageClassification
from vit_ft.arguments.training_arguments import FineTuneTrainingArguments
from vit_ft.training.optimizer import layer_id, parameter_groups
from vit_ft.training.trainer import FineTuneTrainer

from ..conftest import tiny_ft_config

LR, WD, DECAY, LAYERS = 1e-3, 0.05, 0.75, 2


def _model():
    return ViTFTForImageClassification(tiny_ft_config(num_labels=3))


def _expected_depth(name: str) -> int:
    """BEiT's get_num_layer_for_vit, spelt for our names: embeddings 0, block i -> i + 1, the rest last."""
    if ".embeddings." in f".{name}":
        return 0
    if ".layers." in f".{name}":
        return int(name.split(".layers.")[1].split(".")[0]) + 1
    return LAYERS + 1


def _by_name(groups):
    return {name: group for group in groups for name in group["param_names"]}


def test_every_group_follows_the_layer_decay_formula():
    model = _model()
    groups = _by_name(parameter_groups(model, LR, WD, DECAY))
    names = [name for name, _ in model.named_parameters()]
    assert sorted(groups) == sorted(names)
    for name, param in model.named_parameters():
        group = groups[name]
        scale = DECAY ** (LAYERS + 1 - _expected_depth(name))
        assert group["lr"] == pytest.approx(LR * scale) and group["lr_scale"] == pytest.approx(scale), name
        exempt = param.ndim <= 1 or name.endswith(".bias") or name in model.no_weight_decay()
        assert group["weight_decay"] == (0.0 if exempt else WD), name
    # the class token and position embeddings are exempt although they are 3-D
    assert {"vit.embeddings.cls_token", "vit.embeddings.position_embeddings"} <= model.no_weight_decay()
    assert groups["vit.embeddings.cls_token"]["weight_decay"] == 0.0
    assert groups["vit.embeddings.patch_embeddings.projection.weight"]["weight_decay"] == WD
    assert groups["classifier.weight"]["lr"] == LR and groups["vit.layernorm.weight"]["lr"] == LR
    assert groups["vit.layers.0.attention.qkv.weight"]["lr"] == pytest.approx(LR * DECAY**2)


def test_without_layer_decay_only_the_weight_decay_changes_and_tokens_can_be_decayed_again():
    model = _model()
    groups = _by_name(parameter_groups(model, LR, WD))
    assert {group["lr"] for group in groups.values()} == {LR}
    assert groups["vit.embeddings.position_embeddings"]["weight_decay"] == 0.0
    decayed = _by_name(parameter_groups(model, LR, WD, decay_tokens=True))
    assert decayed["vit.embeddings.position_embeddings"]["weight_decay"] == WD
    assert decayed["vit.layers.0.norm1.weight"]["weight_decay"] == 0.0  # norms stay exempt


def test_lora_parameters_group_by_their_block():
    model = get_peft_model(_model(), LoraConfig(r=4, target_modules=["qkv"], modules_to_save=["classifier"]))
    groups = _by_name(parameter_groups(model, LR, WD, DECAY))
    trainable = {name for name, param in model.get_base_model().named_parameters() if param.requires_grad}
    assert set(groups) == trainable
    lora = [name for name in groups if "lora_A" in name and ".layers.1." in name]
    assert lora and groups[lora[0]]["lr"] == pytest.approx(
        LR * DECAY
    )  # block 1 of 2: one step below the head
    head = [name for name in groups if name.startswith("classifier.")]
    assert head and all(groups[name]["lr"] == LR for name in head)
    assert layer_id("base_model.model.vit.layers.1.attention.qkv.lora_A.default.weight", LAYERS) == 2


@pytest.mark.parametrize("optim", ["adamw_torch", "sgd"])
def test_the_trainer_optimizer_and_schedule_keep_the_scales(tmp_path, optim):
    args = FineTuneTrainingArguments(
        output_dir=str(tmp_path), learning_rate=LR, weight_decay=WD, layer_decay=DECAY, optim=optim,
        lr_scheduler_type="cosine", warmup_steps=2, max_steps=10, report_to="none", use_cpu=True,
    )  # fmt: skip
    trainer = FineTuneTrainer(model=_model(), args=args)
    trainer.create_optimizer_and_scheduler(num_training_steps=10)
    optimizer, scheduler = trainer.optimizer, trainer.lr_scheduler
    assert optimizer.param_groups[0]["lr_scale"] == 1.0  # the head first: Trainer logs the base rate
    for _ in range(5):
        optimizer.step()
        scheduler.step()
    base = scheduler.get_last_lr()[0]
    assert 0 < base < LR
    for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr(), strict=True):
        assert lr == pytest.approx(base * group["lr_scale"])
        assert group["weight_decay"] in (0.0, WD)
    assert isinstance(optimizer, torch.optim.AdamW if optim == "adamw_torch" else torch.optim.SGD)
