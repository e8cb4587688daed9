"""The peft methods of `--method` as one table: each method's peft config class, fixed options, the layers it can
adapt, and its defaults (targets, rank, learning rate, their source: `arguments.method_defaults`, per family, which
the run plan applies); `peft_config` builds the config of a run from the table and the recipe keys, after checking
the targets against the model.

One generic path: a new method is one more row of `PEFT_METHOD_TABLE`, never a branch in the stages. Every method's
adapter carries the classifier head (peft `modules_to_save`), so a reload elsewhere gets the trained head back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import peft
from torch import nn

from ..arguments.fields import LORA_KEY_METHODS, PEFT_METHODS, ModelArguments, parse_lora_target_modules
from ..arguments.method_defaults import NORM_TARGETS, method_defaults
from ..model.norms import RMSNorm

# our module names: the fused query/key/value projection (peft's ViT example adapts query and value);
# "attention+mlp" adds the attention output projection and the MLP
# The family members (DeiT, DINOv2, CLIP, SigLIP) load into the same modules, so the presets hold for all of them;
# "attention+mlp" also adapts SigLIP's attention-pooling head (its proj and MLP), which it fine-tunes
TARGET_PRESETS = {"attention": ["qkv"], "attention+mlp": ["qkv", "proj", "fc1", "fc2"]}
# every norm a family's model may hold (pre-norm: CLIP; fc_norm: MAE's layout); LN tuning takes those present
NORMS = tuple(NORM_TARGETS.split(","))
# trained in full besides the head where the model has it: DeiT's second head, on the distillation token
DISTILLATION_HEAD = "distillation_classifier"
LINEAR = (nn.Linear,)
LINEAR_OR_CONV = (nn.Linear, nn.Conv2d)


@dataclass(frozen=True)
class PeftMethod:
    """One peft method: its config class, its defaults and their source, what it adapts, whether it merges."""

    config: str  # the peft config class's name
    targets: tuple[str, ...]  # module names (suffixes, as peft matches them)
    rank_field: str | None  # the config field our rank key sets (None: the method has no rank)
    rank: int | None  # the default of peft_r / lora_r (the row of a checkpoint of no known family)
    learning_rate: float  # the row's learning rate (the plan applies it where the recipe and flags give none)
    source: str
    layers: tuple[type[nn.Module], ...] = LINEAR_OR_CONV  # what it can adapt (peft refuses others)
    options: dict[str, Any] = field(default_factory=dict)  # further fixed config fields
    mergeable: bool = True  # peft's merge_and_unload folds it into plain weights


def _row(name: str, config: str, rank_field: str | None, **kwargs: Any) -> PeftMethod:
    """A method's row: its config, with targets, rank, rate and source from its generic row of the method
    defaults (`arguments.method_defaults`: the one table of them, per family)."""
    row = method_defaults(name, None)
    targets = TARGET_PRESETS.get(row.targets) or row.targets.split(",")
    return PeftMethod(config, tuple(targets), rank_field, row.rank, row.learning_rate, row.source, **kwargs)


PEFT_METHOD_TABLE: dict[str, PeftMethod] = {
    "lora": _row("lora", "LoraConfig", "r", options={"bias": "none"}),
    "dora": _row("dora", "LoraConfig", "r", options={"use_dora": True, "bias": "none"}),
    # the frozen projections saved with the adapter (peft's save_projection), so a reload needs no seed
    "vera": _row("vera", "VeraConfig", "r", layers=LINEAR, options={"save_projection": True, "d_initial": 0.1}),
    "oft": _row("oft", "OFTConfig", "oft_block_size", options={"r": 0}),
    "boft": _row("boft", "BOFTConfig", "boft_block_size", options={"boft_n_butterfly_factor": 1}),
    "loha": _row("loha", "LoHaConfig", "r", options={"alpha": 8}),
    "lokr": _row("lokr", "LoKrConfig", "r", options={"alpha": 8}),
    # total_step, tinit and tfinal are set from the run's steps when training starts (AdaLoraCallback)
    "adalora": _row("adalora", "AdaLoraConfig", "target_r", layers=LINEAR, options={"total_step": 1000, "bias": "none"}),
    "ia3": _row("ia3", "IA3Config", None, layers=LINEAR),
    "ln_tuning": _row("ln_tuning", "LNTuningConfig", None, layers=(nn.LayerNorm, RMSNorm)),
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
