"""The peft methods of `--method` as one table: each method's peft config class, its defaults (targets, rank,
fixed options, the learning rate its source fine-tunes ViTs with) and where they come from; `peft_config` builds
the config of a run from the table and the recipe keys, after checking the targets against the model.

One generic path: a new method is one more row of `PEFT_METHOD_TABLE`, never a branch in the stages. Every method's
adapter carries the classifier head (peft `modules_to_save`), so a reload elsewhere gets the trained head back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import peft
from torch import nn

from ..arguments.fields import LORA_KEY_METHODS, PEFT_METHODS, ModelArguments, parse_lora_target_modules
from ..model.norms import RMSNorm

# our module names: the fused query/key/value projection (peft's ViT example adapts query and value);
# "attention+mlp" adds the attention output projection and the MLP
# The family members (DeiT, DINOv2, CLIP, SigLIP) load into the same modules, so the presets hold for all of them;
# "attention+mlp" also adapts SigLIP's attention-pooling head (its proj and MLP), which it fine-tunes
TARGET_PRESETS = {"attention": ["qkv"], "attention+mlp": ["qkv", "proj", "fc1", "fc2"]}
# every norm a family's model may hold (pre-norm: CLIP; fc_norm: MAE's layout); LN tuning takes those present
NORMS = ("pre_layernorm", "norm1", "norm2", "layernorm", "fc_norm")
# trained in full besides the head where the model has it: DeiT's second head, on the distillation token
DISTILLATION_HEAD = "distillation_classifier"
LINEAR = (nn.Linear,)
LINEAR_OR_CONV = (nn.Linear, nn.Conv2d)
PEFT_SOURCE = "huggingface/peft 0.21 config defaults"
VIT_EXAMPLE = "peft's ViT example (examples/image_classification, r=16, alpha=16, dropout 0.1, lr 5e-3)"


@dataclass(frozen=True)
class PeftMethod:
    """One peft method: its config class, its defaults and their source, what it adapts, whether it merges."""

    config: str  # the peft config class's name
    targets: tuple[str, ...]  # module names (suffixes, as peft matches them)
    rank_field: str | None  # the config field our rank key sets (None: the method has no rank)
    rank: int | None  # the default of peft_r (LoRA's variants take lora_r)
    learning_rate: float  # a starting point (the source's, else LoRA's); the recipe's learning_rate is used
    source: str
    layers: tuple[type[nn.Module], ...] = LINEAR_OR_CONV  # what it can adapt (peft refuses others)
    options: dict[str, Any] = field(default_factory=dict)  # further fixed config fields
    mergeable: bool = True  # peft's merge_and_unload folds it into plain weights


PEFT_METHOD_TABLE: dict[str, PeftMethod] = {
    "lora": PeftMethod("LoraConfig", ("qkv",), "r", None, 5e-3, f"Hu et al. 2021 (arXiv 2106.09685); {VIT_EXAMPLE}",
                       options={"bias": "none"}),
    "dora": PeftMethod("LoraConfig", ("qkv",), "r", None, 5e-3,
                       "Liu et al. 2024 (arXiv 2402.09353): LoRA's r and targets with the magnitude vector; "
                       f"LoRA's rate ({VIT_EXAMPLE})", options={"use_dora": True, "bias": "none"}),
    "vera": PeftMethod("VeraConfig", ("qkv",), "r", 256, 5e-3,
                       f"Kopiczko et al. 2024 (arXiv 2310.11454); {PEFT_SOURCE} (r=256, d_initial 0.1), the frozen "
                       "projections saved with the adapter; LoRA's rate",
                       layers=LINEAR, options={"save_projection": True, "d_initial": 0.1}),
    "oft": PeftMethod("OFTConfig", ("qkv",), "oft_block_size", 32, 5e-3,
                      f"Qiu et al. 2023 (arXiv 2306.07280); {PEFT_SOURCE} (block size 32, Cayley-Neumann); LoRA's rate",
                      options={"r": 0}),
    "boft": PeftMethod("BOFTConfig", ("qkv",), "boft_block_size", 4, 5e-3,
                       f"Liu et al. 2024 (arXiv 2311.06243); {PEFT_SOURCE} (block size 4, one butterfly factor); LoRA's rate",
                       options={"boft_n_butterfly_factor": 1}),
    "loha": PeftMethod("LoHaConfig", ("qkv",), "r", 8, 5e-3,
                       f"Hyeon-Woo et al. 2022 (FedPara, arXiv 2108.06098) via LyCORIS; {PEFT_SOURCE} (r=8, alpha=8); LoRA's rate",
                       options={"alpha": 8}),
    "lokr": PeftMethod("LoKrConfig", ("qkv",), "r", 8, 5e-3,
                       f"Edalati et al. 2022 (KronA, arXiv 2212.10650) via LyCORIS; {PEFT_SOURCE} (r=8, alpha=8); LoRA's rate",
                       options={"alpha": 8}),
    # total_step, tinit and tfinal are set from the run's steps when training starts (AdaLoraCallback)
    "adalora": PeftMethod("AdaLoraConfig", ("qkv",), "target_r", None, 5e-3,
                          "Zhang et al. 2023 (arXiv 2303.10512): init_r = 1.5 x target_r as peft's 12 / 8, the "
                          "budget schedule over the middle 60 % of the steps; LoRA's rate", layers=LINEAR,
                          options={"total_step": 1000, "bias": "none"}),
    # the keys' and values' outputs (our fused qkv scales the queries too) and the MLP's hidden activation
    "ia3": PeftMethod("IA3Config", ("qkv", "fc2"), None, None, 3e-3,
                      "Liu et al. 2022 (arXiv 2205.05638, (IA)^3 / T-Few: l_k, l_v and l_ff; its rate 3e-3)", layers=LINEAR),
    "ln_tuning": PeftMethod("LNTuningConfig", NORMS, None, None, 5e-3,
                            "Zhao et al. 2023 (arXiv 2312.11420): every LayerNorm trained, the rest frozen; LoRA's rate",
                            layers=(nn.LayerNorm, RMSNorm)),
}  # fmt: skip
assert set(PEFT_METHOD_TABLE) == set(PEFT_METHODS)


def _targets(model_args: ModelArguments, method: PeftMethod) -> list[str]:
    """The target module names the run asked for (a preset resolved), or the method's defaults."""
    given = model_args.lora_target_modules if model_args.method in LORA_KEY_METHODS else model_args.peft_target_modules
    if given is None:
        return list(method.targets)
    targets = parse_lora_target_modules(given)
    return TARGET_PRESETS[targets] if isinstance(targets, str) else targets


def check_targets(model: nn.Module, targets: list[str], name: str, method: PeftMethod) -> list[str]:
    """The targets present in `model` (a method's default list keeps only those the model has), each of a layer
    type the method adapts; otherwise a ValueError naming the module, its type and the fix."""
    found: dict[str, list[nn.Module]] = {target: [] for target in targets}
    for module_name, module in model.named_modules():
        for target in targets:
            if module_name == target or module_name.endswith(f".{target}"):
                found[target].append(module)
    present = [target for target, modules in found.items() if modules]
    if not present:
        raise ValueError(
            f"method {name}: no module of the model is named {', '.join(targets)}; name its modules (qkv, proj, fc1, "
            f"fc2, norm1, ...) or a preset ({', '.join(TARGET_PRESETS)}) in the target keys."
        )
    allowed = ", ".join(cls.__name__ for cls in method.layers)
    for target in present:
        bad = next((m for m in found[target] if not isinstance(m, method.layers)), None)
        if bad is not None:
            raise ValueError(
                f"method {name} adapts {allowed} layers, but target {target!r} is a {type(bad).__name__}; "
                "choose targets of that type (e.g. qkv, proj, fc1, fc2)."
            )
    return present


def heads(model: nn.Module) -> list[str]:
    """The modules trained in full and saved with the adapter: the new head (and DeiT's distillation head)."""
    return ["classifier"] + ([DISTILLATION_HEAD] if hasattr(model, DISTILLATION_HEAD) else [])


def peft_config(model_args: ModelArguments, model: nn.Module) -> peft.PeftConfig:
    """The peft config of `model_args.method` for `model`: the table's defaults, the recipe's keys over them
    (lora_* for lora / dora / adalora, peft_* for the others), the head in modules_to_save."""
    name = model_args.method
    method = PEFT_METHOD_TABLE[name]
    targets = check_targets(model, _targets(model_args, method), name, method)
    kwargs: dict[str, Any] = {**method.options, "target_modules": targets, "modules_to_save": heads(model)}
    if name in LORA_KEY_METHODS:
        kwargs.update(lora_alpha=model_args.lora_alpha, lora_dropout=model_args.lora_dropout)
        kwargs[method.rank_field] = model_args.lora_r
        if name == "adalora":  # AdaLoRA starts above its target rank and prunes down to it
            kwargs["init_r"] = max(model_args.lora_r * 3 // 2, model_args.lora_r)
    elif method.rank_field is not None:
        kwargs[method.rank_field] = model_args.peft_r or method.rank
    if name == "ia3":  # IA3 scales a feed-forward layer's input, the others' output
        kwargs["feedforward_modules"] = [t for t in targets if t in ("fc1", "fc2")]
    return getattr(peft, method.config)(**kwargs)


__all__ = ["DISTILLATION_HEAD", "PEFT_METHOD_TABLE", "TARGET_PRESETS", "PeftMethod", "check_targets", "heads",
           "peft_config"]  # fmt: skip
