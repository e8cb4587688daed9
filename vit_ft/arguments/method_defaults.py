"""Each peft method's defaults per ViT family (targets, rank, LoRA's alpha and dropout, learning rate), each row with
its source, and the parameter-efficient rung `method: auto` climbs per family; read by the run plan
(`family_defaults.choose_method_defaults`), by the peft configs (`training.peft_methods`) and by the ladder.

Our model holds every family in the same modules (a fused `qkv`, `proj`, `fc1`, `fc2`, `norm1`, `norm2`; SigLIP's
attention-pooling head adds `attn_pool.q/kv/proj/norm` and its MLP's `fc1`/`fc2`, AIMv2's `attn_pool.kv/proj`), so the
targets are the same names for every family; where a family's published protocol differs (CLIP's LoRA), the family has a row of its own.
`GENERIC` is every other family's row, and the row of a checkpoint of no known family (vit_ft's own digits model).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# the methods that read the lora_* keys (LoRA's variants); the other peft methods read peft_r / peft_target_modules
LORA_KEY_METHODS = ("lora", "dora", "adalora")
GENERIC = "*"
NORM_TARGETS = "pre_layernorm,norm1,norm2,layernorm,fc_norm"  # every norm a family's model may hold
PEFT_CONFIGS = "huggingface/peft 0.21 config defaults"
VIT_EXAMPLE = "peft's ViT example (examples/image_classification, ViT-B/16 IN-21k: r=16, alpha=16, dropout 0.1, lr 5e-3)"
CLIP_LORA = ("CLIP-LoRA (Zanella & Ben Ayed 2024, arXiv 2405.18541; MaxZanella/CLIP-LoRA run_utils.py at 5f32cce: "
             "ViT-B/16, r=2, alpha=1, dropout 0.25 on q, k, v, lr 2e-4, batch 32)")  # fmt: skip


@dataclass(frozen=True)
class MethodDefaults:
    """One method's defaults for one family and where they come from."""

    targets: str  # the target key's value: a preset (attention, attention+mlp) or module names
    rank: int | None  # lora_r for lora / dora / adalora, peft_r for the others (OFT / BOFT: the block size)
    learning_rate: float
    source: str
    alpha: int | None = None  # lora_alpha (LoRA's keys only)
    dropout: float | None = None  # lora_dropout (LoRA's keys only)


_LORA = MethodDefaults("attention", 16, 5e-3, f"Hu et al. 2021 (arXiv 2106.09685); {VIT_EXAMPLE}", 16, 0.1)
_LORA_CLIP = MethodDefaults("attention", 2, 2e-4, CLIP_LORA, 1, 0.25)
_LORA_RATE = "LoRA's rate (ours: the paper gives no ViT rate)"
METHOD_DEFAULTS: dict[str, dict[str, MethodDefaults]] = {
    "lora": {GENERIC: _LORA, "clip": _LORA_CLIP},
    "dora": {  # DoRA trains LoRA's factors plus a magnitude vector and is run with LoRA's settings (its paper)
        GENERIC: MethodDefaults("attention", 16, 5e-3, f"Liu et al. 2024 (arXiv 2402.09353) on LoRA's row: {VIT_EXAMPLE}", 16, 0.1),
        "clip": MethodDefaults("attention", 2, 2e-4, f"Liu et al. 2024 on LoRA's row: {CLIP_LORA}", 1, 0.25),
    },
    "adalora": {  # target_r = lora_r, init_r 1.5 x target_r (peft's 12 / 8)
        GENERIC: MethodDefaults("attention", 16, 5e-3, f"Zhang et al. 2023 (arXiv 2303.10512) at LoRA's row: {VIT_EXAMPLE}", 16, 0.1),
        "clip": MethodDefaults("attention", 2, 2e-4, f"Zhang et al. 2023 at LoRA's row: {CLIP_LORA}", 1, 0.25),
    },
    "vera": {GENERIC: MethodDefaults("attention", 256, 5e-3, f"Kopiczko et al. 2024 (arXiv 2310.11454); {PEFT_CONFIGS} "
                                     f"(r=256, d_initial 0.1); {_LORA_RATE}")},
    "oft": {GENERIC: MethodDefaults("attention", 32, 5e-3, f"Qiu et al. 2023 (arXiv 2306.07280); {PEFT_CONFIGS} (block "
                                    f"size 32, Cayley-Neumann); {_LORA_RATE}")},
    "boft": {GENERIC: MethodDefaults("attention", 4, 5e-3, f"Liu et al. 2024 (arXiv 2311.06243); {PEFT_CONFIGS} (block "
                                     f"size 4, one butterfly factor); {_LORA_RATE}")},
    "loha": {GENERIC: MethodDefaults("attention", 8, 5e-3, f"Hyeon-Woo et al. 2022 (FedPara, arXiv 2108.06098) via "
                                     f"LyCORIS; {PEFT_CONFIGS} (r=8, alpha=8); {_LORA_RATE}")},
    "lokr": {GENERIC: MethodDefaults("attention", 8, 5e-3, f"Edalati et al. 2022 (KronA, arXiv 2212.10650) via LyCORIS; "
                                     f"{PEFT_CONFIGS} (r=8, alpha=8); {_LORA_RATE}")},
    # the keys' and values' outputs (our fused qkv scales the queries too) and the MLP's hidden activation
    "ia3": {GENERIC: MethodDefaults("qkv,fc2", None, 3e-3, "Liu et al. 2022 (arXiv 2205.05638, (IA)^3 / T-Few: l_k, "
                                    "l_v and l_ff; its rate 3e-3)")},
    "ln_tuning": {GENERIC: MethodDefaults(NORM_TARGETS, None, 5e-3, "Zhao et al. 2023 (arXiv 2312.11420): every "
                                          f"LayerNorm (AIMv2: RMSNorm) trained; {_LORA_RATE}")},
}  # fmt: skip
assert set(METHOD_DEFAULTS) == {"lora", "dora", "adalora", "vera", "oft", "boft", "loha", "lokr", "ia3", "ln_tuning"}

# the parameter-efficient rung of `method: auto` per family (others: LoRA)
_V_PETL = ("V-PETL Bench (NeurIPS 2024 datasets track, ViT-B/16 IN-21k): SSF 73.1 over LoRA 72.3 on the VTAB-1k mean, "
           "90.7 over 84.8 on FGVC's (bench.suites.PUBLISHED), the best of the methods vit-ft has")  # fmt: skip
LADDER_PEFT_RUNGS: dict[str, tuple[str, str]] = {
    GENERIC: ("lora", "ours: no published ranking of the methods for this family; LoRA, the most used"),
    "vit": ("ssf", _V_PETL),
    "clip": ("lora", CLIP_LORA.split(";")[0] + ": LoRA above the prompt and adapter methods on CLIP few-shot"),
}


def method_defaults(method: str, family: str | None) -> MethodDefaults:
    """The row of `method` for a checkpoint of `family` (a `FAMILY_DEFAULTS` name, or None: unknown)."""
    rows = METHOD_DEFAULTS[method]
    return rows.get(family or GENERIC, rows[GENERIC])


def method_values(method: str, family: str | None) -> dict[str, Any]:
    """The argument values of `method`'s row for `family`: lora_* for LoRA's variants, peft_* for the others."""
    row = method_defaults(method, family)
    if method in LORA_KEY_METHODS:
        return {"lora_target_modules": row.targets, "lora_r": row.rank, "lora_alpha": row.alpha,
                "lora_dropout": row.dropout, "learning_rate": row.learning_rate}  # fmt: skip
    values: dict[str, Any] = {"peft_target_modules": row.targets, "learning_rate": row.learning_rate}
    return values if row.rank is None else {**values, "peft_r": row.rank}


def ladder_peft_rung(family: str | None) -> tuple[str, str]:
    """(the parameter-efficient rung of `method: auto` for `family`, its source)."""
    return LADDER_PEFT_RUNGS.get(family or GENERIC, LADDER_PEFT_RUNGS[GENERIC])


__all__ = ["GENERIC", "LADDER_PEFT_RUNGS", "LORA_KEY_METHODS", "METHOD_DEFAULTS", "MethodDefaults", "ladder_peft_rung", "method_defaults",
           "method_values"]  # fmt: skip
