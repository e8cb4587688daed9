"""WiSE-FT (Wortsman et al. 2022, mlfoundations/wise-ft): the weights of a zero-shot model and of its fine-tune,
interpolated, theta = (1 - alpha) * theta_zeroshot + alpha * theta_finetuned, every weight (head included); alpha
0 is the zero-shot model, 1 the fine-tune. Without a given alpha the one of best validation accuracy on the grid
is kept (ties: the smaller, nearer the zero-shot model); the curve of validation (and, with `shift`, shifted)
accuracy over alpha is saved as wise.csv / wise.md / wise.png. The output is an ordinary model folder (the fine-tune's
processor, labels and run record, its calibration dropped: it was fitted for alpha 1).

    run_wise("outputs/zs", "outputs/ft", "outputs/wise")                 # alpha chosen on the validation split
    run_wise("outputs/zs", "outputs/ft", "outputs/wise", alpha=0.5, shift="corruptions")
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..model import code_files
from ..reports.robustness import write_wise_curve
from ..utils.output_dir import OutputFiles, check_output_dir
from ..utils.run_record import CALIBRATION_KEY, LABELS_FILE, PROCESSOR_FILE, RUN_RECORD_FILE
from .evaluate.data import folders_read, resolve_eval_data
from .evaluate.outputs import predict_dataset
from .evaluate.shift import (
    CORRUPTIONS_SHIFT,
    accuracy,
    check_shift,
    corruption_logits,
    shift_inputs,
    shifted_eval_data,
)
from .trained import Trained, load_trained

logger = logging.getLogger("vit_ft")

ALPHAS = tuple(round(0.1 * i, 1) for i in range(11))  # the WiSE-FT paper's grid
WISE_FILES = OutputFiles(
    "wise",
    ("config.json", "model.safetensors", PROCESSOR_FILE, LABELS_FILE, RUN_RECORD_FILE, "wise.json", "wise.csv",
     "wise.md", "wise.png", *code_files()),
    "a WiSE-FT model",
)  # fmt: skip


def check_alpha(alpha: float | None, alphas: Sequence[float]) -> None:
    """ValueError for a mixing weight outside [0, 1] (WiSE-FT interpolates; it does not extrapolate)."""
    for value in ([] if alpha is None else [alpha]) + list(alphas):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"alpha {value:g} is outside [0, 1]: 0 is the zero-shot model, 1 the fine-tune; give a "
                             "value between them, e.g. --alpha 0.5.")  # fmt: skip


def check_compatible(zeroshot: Trained, finetuned: Trained) -> None:
    """ValueError unless both models have the same weights' names and shapes and the same labels."""
    a, b = zeroshot.model.state_dict(), finetuned.model.state_dict()
    differ = sorted(set(a) ^ set(b)) or [k for k in a if a[k].shape != b[k].shape]
    if differ:
        shapes = ", ".join(f"{k} {tuple(a[k].shape) if k in a else '-'} vs {tuple(b[k].shape) if k in b else '-'}"
                           for k in differ[:3])  # fmt: skip
        raise ValueError(
            f"{zeroshot.source} and {finetuned.source} are models of different shapes ({shapes}); WiSE-FT interpolates "
            "a fine-tune with the model it started from: fine-tune with --head_init zeroshot from the same checkpoint."
        )
    if zeroshot.id2label != finetuned.id2label:
        raise ValueError(f"{zeroshot.source} and {finetuned.source} name their classes differently; interpolate "
                         "models of the same labels, in the same order.")  # fmt: skip


def interpolate(zeroshot: dict[str, torch.Tensor], finetuned: dict[str, torch.Tensor], alpha: float) -> dict[str, torch.Tensor]:
    """(1 - alpha) * zeroshot + alpha * finetuned for every floating tensor (wise-ft's `_merge`); others (integer
    buffers) the fine-tune's."""
    return {key: torch.lerp(zeroshot[key].float(), value.float(), alpha).to(value.dtype)
            if value.is_floating_point() else value for key, value in finetuned.items()}  # fmt: skip


def _curve(
    finetuned: Trained, thetas: tuple[dict, dict], alphas: Sequence[float], data: Any, shift: str | None,
    seed: int, batch_size: int,
) -> list[dict[str, Any]]:  # fmt: skip
    """Validation (and shifted) accuracy of the interpolated model at each alpha."""
    shifted = None
    if shift not in (None, CORRUPTIONS_SHIFT):  # a folder or a Hub dataset
        shifted = shifted_eval_data(shift, finetuned.id2label, seed)
    rows = []
    for alpha in alphas:
        finetuned.model.load_state_dict(interpolate(*thetas, alpha))
        outputs = predict_dataset(finetuned, data, batch_size)
        row = {"alpha": alpha, "validation": accuracy(outputs.logits, outputs.labels)}
        if shift == CORRUPTIONS_SHIFT:
            logits, kept = corruption_logits(finetuned, data, seed, batch_size)
            row["shifted"] = float(np.mean([accuracy(v, data.labels[kept]) for v in logits.values()]))
        elif shifted is not None:
            found = predict_dataset(finetuned, shifted, batch_size)
            row["shifted"] = accuracy(found.logits, found.labels)
        logger.info("WiSE-FT alpha %.2f: validation %.2f %%%s.", alpha, 100 * row["validation"],
                    f", shifted {100 * row['shifted']:.2f} %" if "shifted" in row else "")  # fmt: skip
        rows.append(row)
    return rows


def run_wise(
    zeroshot: str, finetuned: str, output_dir: str | os.PathLike, alpha: float | None = None,
    alphas: Sequence[float] = ALPHAS, recipe: str | None = None, data_dir: str | None = None,
    shift: str | None = None, seed: int | None = None, max_samples: int | None = None, batch_size: int = 64,
    device: str | None = None, overwrite: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """Interpolate `zeroshot` and `finetuned` (folders or Hub ids of the same shape and labels) into an ordinary model
    folder `output_dir`, alpha given or chosen on the validation split (`recipe`'s or `data_dir`, else the one the
    fine-tune recorded); returns wise.json's contents."""
    check_alpha(alpha, alphas)
    alphas = sorted(set(alphas) | ({alpha} if alpha is not None else set()))
    check_output_dir(output_dir, inputs=[zeroshot, finetuned, *shift_inputs(shift)], holds="the WiSE-FT model")
    WISE_FILES.check(output_dir, overwrite)
    zs = load_trained(zeroshot, device=device, merge_lora=True)
    ft = load_trained(finetuned, device=device, merge_lora=True)
    check_compatible(zs, ft)
    check_shift(shift, ft)
    data = resolve_eval_data(ft.origin, ft.id2label, recipe, data_dir, "validation", seed, max_samples,
                             ft.task.problem_type)  # fmt: skip
    check_output_dir(output_dir, inputs=folders_read(ft.origin, data) + folders_read(zs.origin))
    logger.info("WiSE-FT: %s (alpha 0) and %s (alpha 1), %d alphas on %s (%d images).", zs.source, ft.source,
                len(alphas), data.description, len(data))  # fmt: skip
    thetas = ({k: v.detach().clone() for k, v in zs.model.state_dict().items()},
              {k: v.detach().clone() for k, v in ft.model.state_dict().items()})  # fmt: skip
    curve = _curve(ft, thetas, alphas, data, shift, seed or 0, batch_size)
    best = max(curve, key=lambda row: (row["validation"], -row["alpha"]))
    chosen = alpha if alpha is not None else best["alpha"]
    ft.model.load_state_dict(interpolate(*thetas, chosen))
    record = {"zeroshot": zs.source, "finetuned": ft.source, "alpha": chosen,
              "chosen_by": "given" if alpha is not None else "best validation accuracy", "validation": data.description,
              "shift": shift, "curve": curve}  # fmt: skip
    _write(Path(output_dir), ft, record, overwrite)
    logger.info("WiSE-FT model (alpha %g) in %s; the curve in %s.", chosen, output_dir, Path(output_dir) / "wise.png")
    return record


WISE_RUNS = "wise"  # OUTPUT/wise/start and OUTPUT/wise/finetuned: wise_ft's two runs


def wise_finetune(plan: Any, finetune: Callable[[Any], dict[str, float]], overwrite: bool = False) -> dict[str, float]:
    """`wise_ft: true`, WiSE-FT as the wise-ft repo's one command runs it: the model the fine-tune starts from (method
    lp-ft: the linear probe, `method linear`; head_init zeroshot: `method zeroshot`) and the fine-tune, each an
    ordinary run (`finetune(plan)`) into OUTPUT/wise/start and OUTPUT/wise/finetuned, then `run_wise` of the two
    into OUTPUT (alpha chosen on the validation split, the curve's shifted accuracy with `wise_shift`). Returns the
    fine-tune's metrics with the chosen alpha and its validation accuracy."""
    model_args, data_args, training_args = plan.arguments
    output_dir = Path(training_args.output_dir)
    shift_inputs(data_args.wise_shift)  # before any training: a shifted set that is nowhere is one line
    WISE_FILES.check(output_dir, overwrite)

    def run(folder: str, method: str) -> tuple[str, dict[str, float]]:
        model, data, training = copy.copy(model_args), copy.copy(data_args), copy.copy(training_args)
        model.method, data.wise_ft, data.wise_shift = method, False, None  # checked already: not re-validated
        training.output_dir = str(output_dir / WISE_RUNS / folder)
        training.push_to_hub = False  # what is shared is OUTPUT, the interpolated model
        logger.info("WiSE-FT: the %s model (method %s) into %s.", folder, method, training.output_dir)
        return training.output_dir, finetune(dataclasses.replace(plan, model_args=model, data_args=data,
                                                                 training_args=training).decided())

    start, _ = run("start", "linear" if model_args.method == "lp-ft" else "zeroshot")
    finetuned, metrics = run("finetuned", model_args.method)
    if training_args.process_index != 0:  # the interpolation is one process's (the runs were every process's)
        return metrics
    record = run_wise(start, finetuned, output_dir, shift=data_args.wise_shift, seed=training_args.seed,
                      batch_size=training_args.per_device_eval_batch_size, overwrite=overwrite)  # fmt: skip
    chosen = next(row for row in record["curve"] if row["alpha"] == record["alpha"])
    return {**metrics, "wise_alpha": record["alpha"], "wise_validation_accuracy": chosen["validation"]}


def _write(output_dir: Path, finetuned: Trained, record: dict[str, Any], overwrite: bool) -> None:
    """The model (config, weights, code), the fine-tune's processor and labels, its run record with the WiSE-FT
    entry (its calibration dropped), wise.json and the curve."""
    with WISE_FILES.staged(output_dir, overwrite) as staging:
        finetuned.model.save_pretrained(staging)
        source = finetuned.origin.path
        if source is not None:
            for name in (PROCESSOR_FILE, LABELS_FILE):
                if (Path(source) / name).is_file():
                    shutil.copy(Path(source) / name, staging / name)
        else:  # a Hub id: its processor through the Hub's cache
            from huggingface_hub import hf_hub_download

            shutil.copy(hf_hub_download(finetuned.source, PROCESSOR_FILE), staging / PROCESSOR_FILE)
        run = {k: v for k, v in (finetuned.run_record or {}).items() if k != CALIBRATION_KEY}
        (staging / RUN_RECORD_FILE).write_text(json.dumps({**run, "wise": record, "finished": True}, indent=2) + "\n")
        (staging / "wise.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        write_wise_curve(staging, record["curve"], record["alpha"], record["shift"])


__all__ = ["ALPHAS", "WISE_FILES", "WISE_RUNS", "check_alpha", "check_compatible", "interpolate", "run_wise",
           "wise_finetune"]
