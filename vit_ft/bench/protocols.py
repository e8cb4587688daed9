"""The paper protocol per method and task, as one table: the settings V-PETL Bench trains each cell with, turned
into the fine-tune's flags (`cell_flags`).

Source: V-PETL Bench, github.com/synbol/Parameter-Efficient-Transfer-Learning-Benchmark at c188fad,
`ImageClassification/scripts/run_vit_<method>.sh` (learning rate and weight decay per task) and
`configs/model_<method>/<suite>/<task>.yaml` (100 epochs, 10 warm-up, batch 64 on VTAB and 128 on FGVC, label
smoothing 0.1 on VTAB and 0 on FGVC, no augmentation: a 224 x 224 resize), `train/train_model_<method>.py`
(AdamW, timm's cosine schedule to 1e-5, drop path 0.1). Most of its methods share one learning rate / weight
decay per task (`TASK_RATES`); the methods' own values where they differ are `METHOD_RATES`. Its full
fine-tuning script states only CIFAR-100's and Caltech101's rates; the other tasks take 1e-4 / 5e-2 here (the
middle of its DTD runs), not a published per-task choice. The peft methods V-PETL does not run (DoRA, VeRA,
OFT, BOFT, LoHa, LoKr, AdaLoRA, IA3) take LoRA's row: a starting point, not a tuned protocol.

Differences from V-PETL, stated where the table is printed: V-PETL trains the final VTAB run on all 1,000
images (train800val200) and reports the best test accuracy over its epochs; here 800 train, and the test accuracy
of the epoch best on the 200 validation images is reported (`load_best_model_at_end`: the test split chooses
nothing). The cosine schedule ends at 0 (transformers') instead of 1e-5.
"""

from __future__ import annotations

from .suites import Suite, TaskSpec

PROTOCOL_SOURCE = "V-PETL Bench scripts and configs at c188fad (synbol/Parameter-Efficient-Transfer-Learning-Benchmark)"

TASK_RATES: dict[str, tuple[float, float]] = {  # (learning rate, weight decay): LoRA's, VPT's and linear's
    "cifar100": (5e-3, 5e-3), "caltech101": (6e-3, 0.35), "dtd": (3.2e-3, 0.04), "oxford_flowers102": (0.05, 0.11),
    "oxford_iiit_pet": (7e-4, 0.8), "svhn": (1e-3, 5e-3), "sun397": (1.7e-3, 0.01), "patch_camelyon": (7.2e-3, 2e-3),
    "eurosat": (0.06, 1e-3), "resisc45": (0.01, 0.01), "diabetic_retinopathy": (4e-3, 3e-4),
    "clevr_count": (3.3e-3, 0.01), "clevr_dist": (1.8e-3, 5e-3), "dmlab": (9e-3, 0.1), "kitti": (7.2e-3, 1e-4),
    "dsprites_loc": (3e-3, 1e-3), "dsprites_ori": (0.01, 0.05), "smallnorb_azi": (6.2e-3, 5e-3),
    "smallnorb_ele": (1.1e-3, 5e-4),
    "CUB_200_2011": (1e-3, 0.05), "nabirds": (2e-4, 0.05), "OxfordFlower": (1e-3, 0.05),
    "StanfordDogs": (2.5e-4, 0.05), "StanfordCars": (2e-3, 0.05),
}  # fmt: skip
FULL_DEFAULT = (1e-4, 0.05)
METHOD_RATES: dict[str, dict[str, tuple[float, float]]] = {
    "full": {"cifar100": (5e-4, 0.1), "caltech101": (5e-4, 5e-3)},
    "vpt": {"cifar100": (1e-3, 1e-4)},
    "linear": {"cifar100": (1e-3, 1e-4)},
    "ln_tuning": {"cifar100": (8e-3, 0.01), "caltech101": (5e-3, 0.01)},
    "ssf": {"cifar100": (0.01, 1.0)},
}
# each method's own keys as V-PETL sets them: LoRA rank 8 (its topN), VPT-shallow 100 prompt tokens
METHOD_FLAGS: dict[str, tuple[str, ...]] = {
    "lora": ("--lora_r", "8", "--lora_alpha", "8"),
    "vpt": ("--vpt_tokens", "100"),
}
SUITE_FLAGS: dict[str, tuple[str, ...]] = {
    "vtab1k": ("--per_device_train_batch_size", "64", "--global_batch_size", "64", "--label_smoothing_factor", "0.1"),
    "fgvc": ("--per_device_train_batch_size", "128", "--global_batch_size", "128", "--label_smoothing_factor", "0"),
}
COMMON_FLAGS = (
    "--num_train_epochs", "100", "--warmup_steps", "0.1", "--lr_scheduler_type", "cosine", "--optim", "adamw_torch",
    "--drop_path_rate", "0.1", "--image_size", "224", "--crop_scale_min", "1.0", "--horizontal_flip", "false",
    "--eval_strategy", "epoch", "--save_strategy", "epoch", "--save_total_limit", "1",
    "--load_best_model_at_end", "true", "--metric_for_best_model", "accuracy",
)  # fmt: skip


def rates(method: str, task: str) -> tuple[float, float]:
    """The (learning rate, weight decay) the protocol trains `method` on `task` with."""
    own = METHOD_RATES.get(method, {})
    if task in own:
        return own[task]
    return FULL_DEFAULT if method == "full" else TASK_RATES[task]


def cell_flags(suite: Suite, task: TaskSpec, method: str, seed: int) -> list[str]:
    """The fine-tune's flags of one cell (method x task x seed) under the protocol; the data flags are the
    harness's (`run`), and the user's flags go after these, so they win."""
    learning_rate, weight_decay = rates(method, task.name)
    return [*COMMON_FLAGS, *SUITE_FLAGS[suite.name], *METHOD_FLAGS.get(method, ()), "--method", method,
            "--learning_rate", str(learning_rate), "--weight_decay", str(weight_decay), "--seed", str(seed)]  # fmt: skip


__all__ = ["COMMON_FLAGS", "METHOD_FLAGS", "METHOD_RATES", "PROTOCOL_SOURCE", "TASK_RATES", "cell_flags", "rates"]
