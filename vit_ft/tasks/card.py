"""A fine-tune's model card: YAML metadata and a body saying what the model is, how it did and how to load it,
for its output folder and for the Hub alike. What differs between tasks (the metrics reported, a multi-label
model's threshold and its use through `pipeline()`) is the run's task's (`task_for(run_info["problem_type"])`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from ..reports.robustness import shift_card_lines
from ..utils.hub_ids import is_hub_model
from ..utils.run_record import RUN_RECORD_FILE
from . import task_for


def model_card(
    run_info: dict[str, Any],
    name: str,
    folder: str | Path,
    format: str = "vit_ft",
    repo_id: str | None = None,
    format_reason: str | None = None,
    folded_temperature: float | None = None,
    shift: tuple[dict[str, Any], str] | None = None,
) -> ModelCard:
    """The model card of a fine-tune, for its output folder and for the Hub alike.

    YAML metadata (license, library, pipeline, tags, dataset, base model when it is a Hub id, model-index
    results) and a body stating the recipe, base model, resolution, full or LoRA fine-tuning, the results
    and how to load the model. `run_info` is the run record (`vit_ft_run.json`); `name` is the card's title
    (the Hub repository id, or the output folder's name); `folder` is where the card goes (it links
    training_curves.png and the run record when they are there); `format` is the one it is shared in:
    "vit_ft" (our code beside the weights, loaded with trust_remote_code) or "transformers" (a plain ViT), and
    `format_reason` why (`tools.export.hub_format.ShareFormat.reason`; the card states it). `repo_id` is the Hub
    repository the card is pushed with: the usage snippet loads it by that id; without one the snippet loads
    "path/to/<name>" and says to put the folder's path there (a bare folder name only works from the folder's
    parent). `folded_temperature`: the calibration temperature folded into the shared head (the card says the
    scores are calibrated as they come out of the model), None where the tools divide by the recorded one.
    `shift`: an evaluation's shift section and the data it measured (`reports.robustness.evaluation_shift`), shown
    as the card's robustness section (clean against shifted accuracy, the relative error, seed and severities).
    """
    body = _card_body(run_info, name, format, Path(folder), repo_id, format_reason, folded_temperature, shift)
    return ModelCard(f"---\n{_card_data(run_info, name, format).to_yaml()}\n---\n{body}")


def write_model_card(output_dir: str | Path, run_info: dict[str, Any]) -> Path:
    """README.md of a fine-tune's output folder: `model_card` named after the folder."""
    output_dir = Path(output_dir)
    path = output_dir / "README.md"
    model_card(run_info, output_dir.name, output_dir).save(path)
    return path


def _card_data(run_info: dict[str, Any], name: str, format: str) -> ModelCardData:
    metrics = run_info.get("metrics") or {}
    task = task_for(run_info.get("problem_type"))
    data = run_info.get("data") or {}
    dataset_id = (
        data.get("dataset_name")
        or (data.get("builtin_dataset") and f"sklearn-{data['builtin_dataset']}")
        or "imagefolder"
    )
    split, prefix = (
        ("test", "test_") if any(k.startswith("test_") for k in metrics) else ("validation", "eval_")
    )
    results = [
        EvalResult(
            task_type="image-classification",
            dataset_type=dataset_id,
            dataset_name=dataset_id,
            dataset_split=split,
            metric_type=metric,
            metric_value=float(metrics[prefix + metric]),
            **task.card_result(metric, title, run_info),  # a multi-label result's title and threshold
        )
        for metric, title in task.card_metrics
        if prefix + metric in metrics
    ]
    base = run_info.get("base_model")
    tuning = "lora" if run_info.get("lora") else "full-fine-tuning"
    return ModelCardData(
        license="apache-2.0",
        library_name="transformers",
        tags=[
            "vit_ft",
            "vision",
            "image-classification",
            tuning,
            "custom_code" if format == "vit_ft" else "vit",
            *task.card_tags,
        ],
        datasets=[data["dataset_name"]] if data.get("dataset_name") else None,
        base_model=base if is_hub_model(base) else None,  # the Hub rejects a local path as base_model
        metrics=list(task.card_metric_types),
        model_name=name,
        eval_results=results or None,
        pipeline_tag="image-classification",
    )


def _card_body(
    run_info: dict[str, Any],
    name: str,
    format: str,
    folder: Path,
    repo_id: str | None,
    reason: str | None,
    folded_temperature: float | None = None,
    shift: tuple[dict[str, Any], str] | None = None,
) -> str:
    lora = bool(run_info.get("lora"))
    height, width = run_info.get("image_size") or (None, None)
    data = run_info.get("data") or {}
    dataset = data.get("dataset_name") or data.get("builtin_dataset") or "a local image folder"
    merged = "merged into the weights here" if (folder / "config.json").is_file() else "in `adapter/`"
    # the peft method by name (a run record before the peft methods says only "lora": true)
    method = run_info.get("method") if run_info.get("method") not in (None, "lora", "full") else None
    adapter = f"the peft method {method}" if method else "LoRA (low-rank adapters"
    how = (f"{adapter} ({merged})" if method else f"{adapter}, {merged})") if lora else "full fine-tuning"
    base = run_info.get("base_model")
    base_text = f"[`{base}`](https://huggingface.co/{base})" if is_hub_model(base) else "a local checkpoint"
    task = task_for(run_info.get("problem_type"))
    lines = [
        "",
        f"# {name}",
        "",
        " ".join(
            [f"A Vision Transformer fine-tuned for {task.name} with vit-ft, by {how}.", *task.card_sentences]
        ),
        "",
        f"- Recipe: `{run_info.get('recipe')}`",
        f"- Base model: {base_text}",
        f"- Resolution: {height}x{width} (the image processor resizes to it)",
        f"- Fine-tuning: {(method or 'LoRA') if lora else 'full'}",
        f"- Dataset: `{dataset}`",
        _format_line(format, reason),
        *task.card_lines(run_info),
        *(_calibration_lines(run_info, folded_temperature) if task.fits_temperature else []),
        "",
        "## Evaluation results",
        "",
        _results_table(run_info.get("metrics") or {}, task.card_metrics),
        "",
        *(shift_card_lines(*shift) if shift is not None else []),
        "## Use",
        "",
        _card_usage(repo_id, name, format, lora, f"{height}x{width}", task, run_info),
        "",
    ]
    if (folder / "training_curves.png").is_file():
        lines += ["## Training", "", "![training curves](training_curves.png)", ""]
    if (folder / RUN_RECORD_FILE).is_file():
        lines += [f"All run settings are in `{RUN_RECORD_FILE}`.", ""]
    return "\n".join(lines)


def _calibration_lines(run_info: dict[str, Any], folded: float | None) -> list[str]:
    """The calibration the fine-tune fitted (temperature, ECE before and after, on which split), where the
    scores get it (folded into the head, or divided by vit-ft's tools) and the "unsure" threshold."""
    from ..utils.run_record import CALIBRATION_KEY, recorded_temperature
    from .temperature import UNSURE_BELOW

    record = run_info.get(CALIBRATION_KEY) if isinstance(run_info.get(CALIBRATION_KEY), dict) else {}
    temperature = folded if folded is not None else recorded_temperature(run_info)
    if temperature == 1.0:
        return ["- Calibration: none fitted (raw softmax scores)"]
    ece = record.get("ece")
    measured = (
        f", ECE {ece[0]:.4f} before and {ece[1]:.4f} after on {record.get('images', '?')} "
        f"{record.get('split', 'validation')} images"
        if isinstance(ece, list) and len(ece) == 2 and all(isinstance(v, (int, float)) for v in ece)
        else ""
    )
    where = (
        "folded into the classifier head (weights and bias divided by it): the scores `pipeline()`, onnxruntime "
        "and vit-ft give are calibrated as they come out of the model"
        if folded is not None
        else "vit-ft's tools (predict, evaluate, the demo) divide the logits by it"
    )
    return [
        f"- Calibration: temperature {temperature:.3f} fitted on the validation split{measured}; {where}",
        f"- Unsure: a calibrated top-1 probability below {UNSURE_BELOW:.0%} is reported as unsure (the demo)",
    ]


def _format_line(format: str, reason: str | None) -> str:
    """Which format the folder or repository is in, and why it is in that one."""
    if format == "transformers":
        line = (
            "- Format: transformers, no remote code: `pipeline()`, `AutoModelForImageClassification` and the "
            "Hub's inference widget load it as it is"
        )
    else:
        line = "- Format: vit_ft (vit-ft's own model code beside the weights, loaded with `trust_remote_code=True`)"
    return f"{line}; {reason}" if reason else line


def _card_usage(
    repo_id: str | None,
    name: str,
    format: str,
    lora: bool,
    resolution: str,
    task: Any,
    run_info: dict[str, Any],
) -> str:
    """How to load the model: by its Hub id when pushed, else by the folder's path (not its bare name); the
    task's own use where it has one (a multi-label model: through `pipeline()` either way)."""
    if repo_id:
        where, model = "", f'"{repo_id}"'
    else:
        where, model = (
            f'model_dir = "path/to/{name}"  # the folder\'s path: the folder this README.md is in\n',
            "model_dir",
        )
    usage = task.card_usage(where, model, format, run_info)
    if usage is not None:
        return usage + (" The LoRA adapter is merged into these weights." if lora else "")
    if format == "transformers":
        return (
            "```python\nfrom transformers import pipeline\n\n"
            f'{where}classifier = pipeline("image-classification", model={model})\n'
            'classifier("image.jpg", top_k=5)\n```\n\n'
            "A standard transformers image classifier (exported from vit-ft): no remote code, so "
            f"`AutoModelForImageClassification.from_pretrained({model})` loads it too. Its position embeddings are "
            f"at the fine-tuned {resolution} resolution."
            + (
                " The LoRA adapter is merged into these weights; the adapter alone stays in the fine-tune's output "
                "folder (`vit-ft push --format vit_ft` shares it in `adapter/`)."
                if lora
                else ""
            )
        )
    usage = (
        "```python\nfrom transformers import pipeline\n\n"
        f'{where}classifier = pipeline("image-classification", model={model}, trust_remote_code=True)\n'
        'classifier("image.jpg", top_k=5)\n```\n\n'
        "`trust_remote_code=True` is needed: the model's code (`modeling_vit_ft.py` and its imports) is in this "
        f"{'repository' if repo_id else 'folder'}, and it is the vit-ft ViT (fused-qkv SDPA attention, any input "
        "resolution), not transformers' own ViT; without it, `pipeline()` refuses the folder. With vit-ft "
        "installed, `import vit_ft.model` first and `pipeline()` (or `AutoModelForImageClassification`) loads it "
        f"without remote code, as does `vit_ft.ViTFTForImageClassification.from_pretrained({model})`."
    )
    return usage + (" The LoRA adapter alone (peft) is in `adapter/`." if lora else "")


def _results_table(metrics: dict[str, Any], names: tuple[tuple[str, str], ...]) -> str:
    """One row per split with results (validation, test): the metrics `names` ((key, title) pairs) and the
    loss; "-" where a metric was not recorded."""
    columns = {**dict(names), "loss": "loss"}
    from ..reports.reporting import markdown_table  # deferred: reporting imports matplotlib

    rows = []
    for split, prefix in (("validation", "eval_"), ("test", "test_")):
        values = {title: metrics.get(prefix + key) for key, title in columns.items()}
        if any(isinstance(v, (int, float)) for v in values.values()):
            cells = {t: float(v) if isinstance(v, (int, float)) else "-" for t, v in values.items()}
            rows.append({"split": split, **cells})
    if not rows:
        return "No evaluation results were recorded."
    return markdown_table(rows, ["split", *columns.values()]).rstrip("\n")


__all__ = ["model_card", "write_model_card"]
