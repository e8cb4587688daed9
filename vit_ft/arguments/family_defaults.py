"""Family-aware fine-tuning defaults: when a recipe written for one ViT family runs on a checkpoint of another
(`--recipe pets --model_name_or_path facebook/dinov2-base`), the checkpoint family's own protocol replaces the
recipe's optimisation keys, except those given on the command line; a recipe run on its own family keeps its values.

`FAMILY_DEFAULTS` is the one table (docs/model.md shows it with the sources): family -> the values of
`OPTIMISATION_KEYS` and where they come from. Learning rates are for a global batch of 512, the recipes' batch
(MAE's base rate 5e-4 per 256 images, scaled linearly as its FINETUNE.md does). `choose_family_defaults` decides,
from the recipe's values and the flags, which are taken; `parse_args` (recipes.py) merges them between the recipe
and the flags and hands the decision to the run (the training arguments' `family_defaults` attribute), whose first log
lines (`describe_family_defaults`) and run record state it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..utils.hub_ids import check_hub_reachable, is_hub_id
from .checks import RecipeError
from .method_defaults import METHOD_DEFAULTS, method_values

# the recipe keys a family's protocol replaces: optimiser, schedule warm-up, layer decay, drop path, head layout
OPTIMISATION_KEYS = (
    "learning_rate",
    "weight_decay",
    "optim",
    "optim_args",
    "layer_decay",
    "warmup_steps",
    "drop_path_rate",
    "pooling",
    "fc_norm",
)
# keys that only mean something together: a flag for one keeps the recipe's other (sgd's momentum with sgd)
_PAIRED_KEYS = (("optim", "optim_args"), ("pooling", "fc_norm"))


@dataclass(frozen=True)
class FamilyProtocol:
    """One family's fine-tuning defaults (every key of OPTIMISATION_KEYS) and their source."""

    name: str  # the family's name in messages
    values: dict[str, Any]
    source: str  # the paper / repository the values come from, and what is common practice instead


_ADAMW = {"optim": "adamw_torch", "optim_args": None}
# the rows that others follow (DINOv3 DINOv2's, SigLIP and AIMv2 CLIP's, MSN MAE's), each once
_DINOV2 = {"learning_rate": 2e-5, "weight_decay": 0.05, **_ADAMW, "layer_decay": 0.75, "warmup_steps": 0.1,
           "drop_path_rate": 0.1, "pooling": "cls+mean", "fc_norm": None}  # fmt: skip
_CLIP = {"learning_rate": 3e-5, "weight_decay": 0.1, **_ADAMW, "layer_decay": 0.65, "warmup_steps": 0.1,
         "drop_path_rate": 0.1, "pooling": None, "fc_norm": None}  # fmt: skip
_MAE = {"learning_rate": 1e-3, "weight_decay": 0.05, **_ADAMW, "layer_decay": 0.65, "warmup_steps": 0.05,
        "drop_path_rate": 0.1, "pooling": "mean", "fc_norm": True}  # fmt: skip
FAMILY_DEFAULTS: dict[str, FamilyProtocol] = {
    "vit": FamilyProtocol(
        "ViT",
        {"learning_rate": 0.01, "weight_decay": 0.0, "optim": "sgd", "optim_args": "momentum=0.9",
         "layer_decay": None, "warmup_steps": 0.05, "drop_path_rate": 0.0, "pooling": "cls", "fc_norm": None},
        "ViT paper (Dosovitskiy et al. 2021, arXiv 2010.11929, App. B.1.1): SGD momentum 0.9, no weight decay, "
        "batch 512, class token; lr 0.01 is the middle of its sweep {0.001, 0.003, 0.01, 0.03}",
    ),
    "deit": FamilyProtocol(
        "DeiT",
        {"learning_rate": 1e-4, "weight_decay": 0.05, **_ADAMW, "layer_decay": None, "warmup_steps": 0.05,
         "drop_path_rate": 0.1, "pooling": None, "fc_norm": None},
        "DeiT (Touvron et al. 2021, arXiv 2012.12877, Table 9): AdamW, weight decay 0.05, drop path 0.1, warm-up; "
        "lr 1e-4 at batch 512 is common fine-tuning practice (its training lr is 5e-4 x batch/512)",
    ),
    "dinov2": FamilyProtocol(
        "DINOv2",
        _DINOV2,
        "DINOv2 (Oquab et al. 2023, arXiv 2304.07193): its linear heads read [class token, patch mean]; the paper "
        "gives no full fine-tuning protocol: AdamW lr 2e-5, layer decay 0.75, drop path 0.1 are common practice "
        "(small rates keep the features; DINOv2's tracker reports collapse at ViT rates)",
    ),
    "dinov3": FamilyProtocol(
        "DINOv3",
        {**_DINOV2, "pooling": None},
        "DINOv3 (Siméoni et al. 2025, arXiv 2508.10104) reports frozen-backbone probes; as DINOv2's row (common "
        "practice), with the checkpoint's own pooling",
    ),
    "clip": FamilyProtocol(
        "CLIP",
        _CLIP,
        "WiSE-FT (Wortsman et al. 2022, arXiv 2109.01903): AdamW lr 3e-5, weight decay 0.1, batch 512; layer "
        "decay and drop path from FT-CLIP (Dong et al. 2022, arXiv 2212.06138: 0.6 for ViT-B, ours 0.65)",
    ),
    "siglip": FamilyProtocol(
        "SigLIP",
        _CLIP,
        "CLIP's row (common practice: SigLIP, Zhai et al. 2023, arXiv 2303.15343, and SigLIP 2, arXiv 2502.14786, "
        "give no full fine-tuning protocol), with the checkpoint's own attention-pooling head",
    ),
    "mae": FamilyProtocol(
        "MAE",
        _MAE,
        "MAE (He et al. 2022, arXiv 2111.06377; facebookresearch/mae FINETUNE.md, ViT-B): AdamW, blr 5e-4 x "
        "batch/256, layer decay 0.65, weight decay 0.05, drop path 0.1, warm-up 5 of 100 epochs, mean pooling + "
        "fc_norm",
    ),
    "msn": FamilyProtocol(
        "MSN",
        {**_MAE, "pooling": "cls", "fc_norm": None},
        "MAE's row with the class token (common practice: MSN, Assran et al. 2022, arXiv 2204.07141, reports "
        "linear and low-shot evaluation; BEiT's and MAE's layer decay 0.65 for ViT-B)",
    ),
    "aimv2": FamilyProtocol(
        "AIMv2",
        _CLIP,
        "CLIP's row (common practice: AIMv2, Fini et al. 2024, arXiv 2411.14402, reports attentive probes of the "
        "frozen trunk), with the checkpoint's own attention-pooling head",
    ),
}
# a checkpoint config's model_type -> its row
MODEL_TYPE_FAMILIES = {
    "vit": "vit",
    "deit": "deit",
    "dinov2": "dinov2",
    "dinov2_with_registers": "dinov2",
    "dinov3_vit": "dinov3",
    "clip": "clip",
    "clip_vision_model": "clip",
    "metaclip_2": "clip",
    "metaclip_2_vision_model": "clip",
    "siglip": "siglip",
    "siglip_vision_model": "siglip",
    "siglip2": "siglip",
    "siglip2_vision_model": "siglip",
    "vit_mae": "mae",
    "vit_msn": "msn",
    "aimv2": "aimv2",
    "aimv2_vision_model": "aimv2",
}
# a timm architecture's tags (`vit_base_patch16_224.mae`) -> its row; a plain timm ViT is the ViT's
_TIMM_TAGS = (("deit", "deit"), ("mae", "mae"), ("dinov2", "dinov2"), ("dinov3", "dinov3"), ("siglip", "siglip"), ("clip", "clip"))


def checkpoint_family(name_or_path: str, cache_dir: str | None = None) -> str | None:
    """The FAMILY_DEFAULTS row of a checkpoint, from its config.json's model_type (timm's: its architecture's
    tags), read alone (a folder, the HF cache, or one small download); None when unreadable or not a family."""
    config = read_config_json(name_or_path, cache_dir)
    if config is None:
        return None
    if "architecture" in config and "model_type" not in config:  # timm's Hub layout
        tags = str(config["architecture"]).replace(".", "_").split("_")
        return next((family for tag, family in _TIMM_TAGS if tag in tags), "vit")
    return MODEL_TYPE_FAMILIES.get(str(config.get("model_type")))


def read_config_json(name_or_path: str, cache_dir: str | None = None) -> dict[str, Any] | None:
    """A checkpoint's config.json as written (a folder's, or a Hub repo's alone: one lookup without
    huggingface_hub's retries, then that file), or None when unreadable: no such file, repo or network."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        file = path / "config.json"
    elif not is_hub_id(str(name_or_path)):
        return None
    else:
        try:  # one lookup without huggingface_hub's retries first (check_hub_reachable), then config.json alone
            from huggingface_hub import hf_hub_download

            check_hub_reachable(str(name_or_path), cache_dir=cache_dir)
            file = Path(hf_hub_download(str(name_or_path), "config.json", cache_dir=cache_dir))
        except Exception:  # no such repo, no network, offline: the model loader and the checks report it
            return None
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def choose_family_defaults(
    recipe: dict[str, Any], flags: dict[str, Any], recipe_name: str | None
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the family's values to merge over the recipe's, the decision for the run's log and record).

    Only a recipe run on a checkpoint named on the command line gets a decision; the recipe's family is its
    `recipe_family` key, else its own model_name_or_path's. Nothing is taken when the families agree, or when
    either is unknown (the decision says which and why)."""
    if not recipe or "model_name_or_path" not in flags:
        return {}, None
    checkpoint = str(flags["model_name_or_path"])
    if recipe.get("model_name_or_path") == checkpoint:
        return {}, None  # the recipe's own checkpoint, named again
    written_for = flags.get("recipe_family") or recipe.get("recipe_family")
    if written_for is None and recipe.get("model_name_or_path") is not None:
        written_for = checkpoint_family(str(recipe["model_name_or_path"]), flags.get("cache_dir"))
    family = checkpoint_family(checkpoint, flags.get("cache_dir") or recipe.get("cache_dir"))
    decision: dict[str, Any] = {
        "recipe": recipe_name,
        "recipe_family": written_for,
        "checkpoint": checkpoint,
        "checkpoint_family": family,
        "taken": [],
    }
    if family is None or written_for is None or family == written_for:
        if family is None:
            decision["reason"] = "the checkpoint's config names no ViT family vit_ft knows, or is not readable here"
        elif written_for is None:
            decision["reason"] = (
                "the recipe's family is unknown: its model_name_or_path's config is not readable here; set "
                "--recipe_family"
            )
        else:
            decision["reason"] = "the recipe was written for this family: it keeps its own values"
        return {}, decision
    given = set(flags)
    for pair in _PAIRED_KEYS:
        if given & set(pair):
            given |= set(pair)
    # the values that change the recipe's (one it leaves unset counts as unset)
    taken = {
        key: value
        for key, value in _family_values(family, run_method(recipe, flags)).items()
        if key not in given and value != recipe.get(key)
    }
    decision["taken"] = [
        {"key": key, "value": value, "recipe_value": recipe.get(key), "flag": f"--{key}"}
        for key, value in taken.items()
    ]
    decision["kept_flags"] = sorted(key for key in OPTIMISATION_KEYS if key in flags)
    decision["source"] = FAMILY_DEFAULTS[family].source
    return taken, decision


def _family_values(family: str, method: str | None) -> dict[str, Any]:
    """A family's values over a recipe of another family's: its protocol, and for a peft method the method's
    learning rate (the protocols' rates are full fine-tuning's) and, where the family has a row of its own for
    the method (`method_defaults.METHOD_DEFAULTS`), that row's targets and rank."""
    values = dict(FAMILY_DEFAULTS[family].values)
    if method in METHOD_DEFAULTS:
        own = method_values(method, family)
        values["learning_rate"] = own.pop("learning_rate")
        if family in METHOD_DEFAULTS[method]:
            values.update(own)
    return values


def run_method(recipe: dict[str, Any], flags: dict[str, Any]) -> str | None:
    """The method the run's values name, as the merge resolves it: the flags' (`method`, else `use_lora`), else the
    recipe's; None when neither names one (full fine-tuning)."""
    for layer in (flags, recipe):
        if layer.get("method") is not None:
            return str(layer["method"])
        if layer.get("use_lora") is not None:
            return "lora" if layer["use_lora"] else "full"
    return None


def choose_method_defaults(
    recipe: dict[str, Any], flags: dict[str, Any], family_decision: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The peft method's defaults for the checkpoint's family (`method_defaults.method_values`) that neither the
    recipe nor the flags give: merged under the recipe, so a user's key always wins. `family_decision`
    (`choose_family_defaults`'): the family it read for the same checkpoint, not read again."""
    method = run_method(recipe, flags)
    if method not in METHOD_DEFAULTS:
        return {}
    if family_decision is not None:  # the flags' checkpoint, whose config.json the decision has read
        family = family_decision["checkpoint_family"]
    else:
        checkpoint = flags.get("model_name_or_path") or recipe.get("model_name_or_path")
        cache_dir = flags.get("cache_dir") or recipe.get("cache_dir")
        family = checkpoint_family(str(checkpoint), cache_dir) if checkpoint else None
    values = method_values(method, family)
    return {key: value for key, value in values.items() if key not in flags and key not in recipe}


def check_recipe_family(value: str | None) -> None:
    """`recipe_family` names a FAMILY_DEFAULTS row (or is unset)."""
    if value is not None and value not in FAMILY_DEFAULTS:
        raise RecipeError(
            f"recipe_family={value!r} is no family; use one of {', '.join(FAMILY_DEFAULTS)}, or leave it unset to "
            "read it from the recipe's model_name_or_path."
        )


def describe_family_defaults(decision: dict[str, Any] | None) -> list[str]:
    """The run's first log lines: each family default taken, its value, why and the flag that overrides it."""
    if not decision:
        return []
    family, written_for = decision["checkpoint_family"], decision["recipe_family"]
    if not decision["taken"]:
        why = decision.get("reason") or "every optimisation key was given on the command line"
        return [f"Family defaults: none taken ({why}; checkpoint family {family}, recipe's {written_for})."]
    name = FAMILY_DEFAULTS[family].name
    lines = [
        f"Family defaults: {decision['checkpoint']} is {name}, the recipe {decision['recipe']} was written for "
        f"{FAMILY_DEFAULTS[written_for].name}: {name}'s fine-tuning protocol replaces the recipe's optimisation "
        f"keys ({decision['source']})."
    ]
    for row in decision["taken"]:
        lines.append(
            f"  {row['key']} = {_show(row['value'])} ({name} default; the recipe's {_show(row['recipe_value'])}); "
            f"override with {row['flag']}"
        )
    if decision.get("kept_flags"):
        lines.append(f"  kept from the command line: {', '.join(decision['kept_flags'])}")
    return lines


def _show(value: Any) -> str:
    return "unset" if value is None else str(value)


__all__ = [
    "FAMILY_DEFAULTS",
    "MODEL_TYPE_FAMILIES",
    "OPTIMISATION_KEYS",
    "FamilyProtocol",
    "check_recipe_family",
    "checkpoint_family",
    "choose_family_defaults",
    "choose_method_defaults",
    "describe_family_defaults",
    "read_config_json",
    "run_method",
]
