"""Optimizer parameter groups: layer-wise learning-rate decay and the weight-decay exemptions, for any optimizer.

As BEiT's `optim_factory.get_parameter_groups` and timm's `param_groups_layer_decay`: the embeddings (patch
projection, class token, position embeddings, and a pre-block LayerNorm where the model has one) are layer 0,
block i is layer i + 1, everything after the blocks (final LayerNorm, pooling head, classifier) is the last,
num_hidden_layers + 1; a parameter of layer d trains at learning_rate * layer_decay ** (last - d). (timm's
regular expression puts a pre-block norm with the final norm; here it sits with the embeddings it follows.)
No weight decay on biases and other 1-D parameters (LayerNorms, layer scale) and on the names the model's
`no_weight_decay()` lists (class token, position embeddings), as timm's `param_groups_weight_decay`.

Each group carries `lr_scale` (timm's key) and its `lr` = learning_rate * lr_scale already set: the Trainer's
schedulers (LambdaLR) multiply each group's initial lr, so the decay holds through warm-up and cosine decay, and
the optimizer's saved state restores it on --resume. Groups are ordered head first, so the learning rate that
the Trainer logs (its first group's) is the base rate. A PEFT (LoRA) model is grouped by its base model's names
(`vit.layers.3.attention.qkv.lora_A.default.weight` is in block 3).
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn

# `layers.<i>.` of the encoder, and the modules before the first block; whatever else is after the blocks
_BLOCK = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_STEM = re.compile(r"(?:^|\.)(embeddings|pre_layernorm)\.")


def layer_id(name: str, num_layers: int) -> int:
    """The layer-decay depth of a parameter name: 0 embeddings, i + 1 for block i, num_layers + 1 the head."""
    block = _BLOCK.search(name)
    if block:
        return int(block.group(1)) + 1
    if _STEM.search(name):
        return 0
    return num_layers + 1


def _base_model(model: nn.Module) -> nn.Module:
    """The transformers model under a PEFT wrapper (its parameter names are the ones we group by)."""
    get_base_model = getattr(model, "get_base_model", None)
    return get_base_model() if callable(get_base_model) else model


def no_weight_decay_names(model: nn.Module) -> set[str]:
    """The parameter names (of the base model) that `no_weight_decay()` exempts, none when it has no such method."""
    base = _base_model(model)
    method = getattr(base, "no_weight_decay", None)
    return set(method()) if callable(method) else set()


def parameter_groups(
    model: nn.Module,
    learning_rate: float,
    weight_decay: float,
    layer_decay: float | None = None,
    decay_tokens: bool = False,
) -> list[dict[str, Any]]:
    """Optimizer parameter groups of the trainable parameters, keyed by (layer, decay or not); see the module.

    `layer_decay` None gives every group lr_scale 1. `decay_tokens` puts the `no_weight_decay()` names back
    under weight decay (biases and 1-D parameters stay exempt). Each group has `params`, `lr`, `lr_scale`,
    `weight_decay`, `layer_id` and `param_names`.
    """
    base = _base_model(model)
    num_layers = int(base.config.num_hidden_layers)
    exempt = set() if decay_tokens else no_weight_decay_names(model)
    last = num_layers + 1
    groups: dict[tuple[int, bool], dict[str, Any]] = {}
    for name, param in base.named_parameters():
        if not param.requires_grad:
            continue
        decays = not (param.ndim <= 1 or name.endswith(".bias") or name in exempt)
        depth = layer_id(name, num_layers) if layer_decay is not None else last
        scale = layer_decay ** (last - depth) if layer_decay is not None else 1.0
        group = groups.setdefault(
            (depth, decays),
            {
                "params": [],
                "param_names": [],
                "lr": learning_rate * scale,
                "lr_scale": scale,
                "weight_decay": weight_decay if decays else 0.0,
                "layer_id": depth,
            },
        )
        group["params"].append(param)
        group["param_names"].append(name)
    # the head's groups first (decaying before exempt, as Trainer orders them): the logged lr is the base rate
    return [groups[key] for key in sorted(groups, key=lambda key: (-key[0], not key[1]))]


def wants_own_groups(args: Any) -> bool:
    """Whether the fine-tune's arguments change Trainer's grouping: layer decay, or weight decay on the tokens
    to be exempt (with weight_decay 0 the exemption changes nothing, and Trainer's groups are kept)."""
    layer_decay = getattr(args, "layer_decay", None)
    return layer_decay is not None or (
        args.weight_decay > 0 and not getattr(args, "weight_decay_tokens", True)
    )


def build_optimizer(
    model: nn.Module, optimizer_cls: type, optimizer_kwargs: dict[str, Any], args: Any
) -> torch.optim.Optimizer:
    """`optimizer_cls(parameter_groups(...), **optimizer_kwargs)` for the class and kwargs Trainer chose for
    `args.optim` (`Trainer.get_optimizer_cls_and_kwargs`), whose `lr` is the base learning rate.

    Optimizers that Trainer builds from the model itself (GaLore, LOMO, Muon, ...) take no parameter groups.
    """
    from transformers.trainer_optimizer import is_optimizer_factory

    special = {"params", "model", "optimizer_dict"} & set(optimizer_kwargs)
    if special or is_optimizer_factory(optimizer_cls):
        raise ValueError(
            f"optim={args.optim!r} builds its own parameter groups, so layer_decay and the weight-decay exemptions "
            "cannot apply; use an AdamW or SGD optimizer (e.g. --optim adamw_torch), or unset layer_decay."
        )
    kwargs = dict(optimizer_kwargs)
    learning_rate = kwargs.pop("lr", args.learning_rate)
    groups = parameter_groups(
        model,
        learning_rate,
        args.weight_decay,
        getattr(args, "layer_decay", None),
        getattr(args, "weight_decay_tokens", False),
    )
    return optimizer_cls(groups, lr=learning_rate, **kwargs)


__all__ = [
    "build_optimizer",
    "layer_id",
    "no_weight_decay_names",
    "parameter_groups",
    "wants_own_groups",
]
