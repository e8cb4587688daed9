"""A fine-tune's model card: YAML metadata and a body saying what the model is, how it did and how to load it,
for its output folder and for the Hub alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from ..metrics.multilabel import DEFAULT_THRESHOLD, MULTI_LABEL, MULTILABEL_METRIC_NAMES, THRESHOLD_ATTRIBUTE
from ..utils.hub_ids import is_hub_model
from ..utils.run_record import RUN_RECORD_FILE


def model_card(
    run_info: dict[str, Any],
    name: str,
    folder: str | Path,
    format: str = "vit_ft",
    repo_id: str | None = None,
    format_reason: str | None = None,
) -> ModelCard:
    """The model card of a fine-tune, for its output folder and for the Hub alike.

    YAML metadata (license, library, pipeline, tags, dataset, base model when it is a Hub id, model-index
    results) and a body stating the recipe, base model, resolution, full or LoRA fine-tuning, the results
    and how to load the model. `run_info` is the run record (`vit_ft_run.json`); `name` is the card's title
    (the Hub repository id, or the output folder's name); `folder` is where the card goes (it links
    training_curves.png and the run record when they are there); `format` is the one it is shared in:
    "vit_ft" (our code beside the weights, loaded with trust_remote_code) or "transformers" (a plain ViT), and
    `format_reason` why (`tools.hub_format.ShareFormat.reason`; the card states it). `repo_id` is the Hub
    repository the card is pushed with: the usage snippet loads it by that id; without one the snippet loads
    "path/to/<name>" and says to put the folder's path there (a bare folder name only works from the folder's
    parent).
    """
    body = _card_body(run_info, name, format, Path(folder), repo_id, format_reason)
    return ModelCard(f"---\n{_card_data(run_info, name, format).to_yaml()}\n---\n{body}")


def write_model_card(output_dir: str | Path, run_info: dict[str, Any]) -> Path:
    """README.md of a fine-tune's output folder: `model_card` named after the folder."""
    output_dir = Path(output_dir)
    path = output_dir / "README.md"
    model_card(run_info, output_dir.name, output_dir).save(path)
    return path


# the metrics a card reports, in its model-index and its table: (metric key, title)
SINGLE_LABEL_METRICS = (("accuracy", "accuracy"), ("top5_accuracy", "top-5 accuracy"), ("f1", "F1"))
MULTILABEL_METRICS = tuple(
    zip(MULTILABEL_METRIC_NAMES, ("mAP", "F1 micro", "F1 macro", "exact match"), strict=True)
)


def is_multi_label_run(run_info: dict[str, Any]) -> bool:
    """Whether the run record describes a multi-label fine-tune: its `problem_type`, its tuned decision threshold,
    or its mAP metrics say so."""
    metrics = run_info.get("metrics") or {}
    return (
        run_info.get("problem_type") == MULTI_LABEL
        or isinstance(run_info.get(THRESHOLD_ATTRIBUTE), dict)
        or any(key.endswith("_mAP") for key in metrics)
    )


def _card_data(run_info: dict[str, Any], name: str, format: str) -> ModelCardData:
    metrics = run_info.get("metrics") or {}
    multi = is_multi_label_run(run_info)
    value = _threshold(run_info)[0]
    # F1 and exact match count the labels at or above it; a per-label list stays in config.json, not repeated
    threshold = {"threshold": "per label (decision_threshold)" if isinstance(value, list) else value}
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
            task_name="Multi-label image classification" if multi else None,
            dataset_type=dataset_id,
            dataset_name=dataset_id,
            dataset_split=split,
            metric_type=metric,
            metric_name=title if multi else None,
            metric_value=float(metrics[prefix + metric]),
            metric_args=threshold if multi and metric != "mAP" else None,  # mAP needs no threshold
        )
        for metric, title in (MULTILABEL_METRICS if multi else SINGLE_LABEL_METRICS)
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
            *(["multi-label-classification"] if multi else []),
        ],
        datasets=[data["dataset_name"]] if data.get("dataset_name") else None,
        base_model=base if is_hub_model(base) else None,  # the Hub rejects a local path as base_model
        metrics=["mAP", "f1", "exact_match"] if multi else ["accuracy", "f1"],
        model_name=name,
        eval_results=results or None,
        pipeline_tag="image-classification",
    )


def _card_body(
    run_info: dict[str, Any], name: str, format: str, folder: Path, repo_id: str | None, reason: str | None
) -> str:
    lora = bool(run_info.get("lora"))
    height, width = run_info.get("image_size") or (None, None)
    data = run_info.get("data") or {}
    dataset = data.get("dataset_name") or data.get("builtin_dataset") or "a local image folder"
    merged = "merged into the weights here" if (folder / "config.json").is_file() else "in `adapter/`"
    how = f"LoRA (low-rank adapters, {merged})" if lora else "full fine-tuning"
    base = run_info.get("base_model")
    base_text = f"[`{base}`](https://huggingface.co/{base})" if is_hub_model(base) else "a local checkpoint"
    multi = is_multi_label_run(run_info)
    task = "multi-label image classification" if multi else "image classification"
    lines = [
        "",
        f"# {name}",
        "",
        f"A Vision Transformer fine-tuned for {task} with vit-ft, by {how}."
        + (f" {MULTILABEL_TASK}" if multi else ""),
        "",
        f"- Recipe: `{run_info.get('recipe')}`",
        f"- Base model: {base_text}",
        f"- Resolution: {height}x{width} (the image processor resizes to it)",
        f"- Fine-tuning: {'LoRA' if lora else 'full'}",
        f"- Dataset: `{dataset}`",
        _format_line(format, reason),
        *([_threshold_line(run_info)] if multi else []),
        "",
        "## Evaluation results",
        "",
        _results_table(run_info.get("metrics") or {}, MULTILABEL_METRICS if multi else SINGLE_LABEL_METRICS),
        "",
        "## Use",
        "",
        _card_usage(
            repo_id, name, format, lora, f"{height}x{width}", _threshold(run_info)[0] if multi else None
        ),
        "",
    ]
    if (folder / "training_curves.png").is_file():
        lines += ["## Training", "", "![training curves](training_curves.png)", ""]
    if (folder / RUN_RECORD_FILE).is_file():
        lines += [f"All run settings are in `{RUN_RECORD_FILE}`.", ""]
    return "\n".join(lines)


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
    repo_id: str | None, name: str, format: str, lora: bool, resolution: str, threshold: Any = None
) -> str:
    """How to load the model: by its Hub id when pushed, else by the folder's path (not its bare name). A
    multi-label model (`threshold`: its decision threshold) is used through `pipeline()` either way."""
    if repo_id:
        where, model = "", f'"{repo_id}"'
    else:
        where, model = (
            f'model_dir = "path/to/{name}"  # the folder\'s path: the folder this README.md is in\n',
            "model_dir",
        )
    if threshold is not None:
        usage = _multilabel_usage(where, model, format, threshold)
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
        "```python\nfrom transformers import AutoImageProcessor, AutoModelForImageClassification\n\n"
        f"{where}model = AutoModelForImageClassification.from_pretrained({model}, trust_remote_code=True)\n"
        f"processor = AutoImageProcessor.from_pretrained({model})\n```\n\n"
        f"The model's code (`modeling_vit_ft.py` and its imports) is in this {'repository' if repo_id else 'folder'}: "
        "it is the vit-ft ViT (fused-qkv SDPA attention, any input resolution), not transformers' own ViT. With "
        f"vit-ft installed, `vit_ft.ViTFTForImageClassification.from_pretrained({model})` loads it without "
        "remote code."
    )
    return usage + (" The LoRA adapter alone (peft) is in `adapter/`." if lora else "")


def _results_table(metrics: dict[str, Any], names: tuple[tuple[str, str], ...] = SINGLE_LABEL_METRICS) -> str:
    """One row per split with results (validation, test): the metrics `names` ((key, title) pairs) and the
    loss; "-" where a metric was not recorded."""
    columns = {**dict(names), "loss": "loss"}
    from .reporting import markdown_table  # deferred: reporting imports matplotlib

    rows = []
    for split, prefix in (("validation", "eval_"), ("test", "test_")):
        values = {title: metrics.get(prefix + key) for key, title in columns.items()}
        if any(isinstance(v, (int, float)) for v in values.values()):
            cells = {t: float(v) if isinstance(v, (int, float)) else "-" for t, v in values.items()}
            rows.append({"split": split, **cells})
    if not rows:
        return "No evaluation results were recorded."
    return markdown_table(rows, ["split", *columns.values()]).rstrip("\n")


# ---- multi-label ------------------------------------------------------------------------------------------------

MULTILABEL_TASK = (
    "Each label's probability is the sigmoid of its logit, independent of the others (they do not sum to 1); an "
    "image gets every label whose probability is at or above the decision threshold, so several labels or none."
)


# how the fine-tune chose the threshold (`training.multilabel.tune_decision_threshold`'s "kind"), in words
THRESHOLD_KINDS = {
    "global": "tuned on the {split} split{images} for the best micro F1 (the test split never chose it)",
    "per_class": "tuned on the {split} split{images} for each label's best F1 (the test split never chose it)",
    "fixed": "fixed by the recipe",
    "default": "the default: there was no validation split to tune it on",
}


def _threshold(run_info: dict[str, Any]) -> tuple[float | list[float], str]:
    """A multi-label run's decision threshold (one float, or one per label in label id order) and how it was
    chosen, in words: the run record's (`THRESHOLD_ATTRIBUTE`: value, kind, split, images), else the default."""
    record = run_info.get(THRESHOLD_ATTRIBUTE)
    if not isinstance(record, dict) or record.get("value") is None:
        return DEFAULT_THRESHOLD, "the default: none was tuned"
    images = f" ({record['images']:,} images)" if isinstance(record.get("images"), int) else ""
    how = THRESHOLD_KINDS.get(record.get("kind"), "")
    how = how.format(split=record.get("split") or "validation", images=images)
    where = "`decision_threshold` in config.json"
    return record["value"], f"{how}; {where}" if how else where


def _threshold_line(run_info: dict[str, Any]) -> str:
    """The card's bullet stating a multi-label model's decision threshold and how it was chosen."""
    value, source = _threshold(run_info)
    if isinstance(value, list):
        return (
            f"- Decision threshold: one per label, from {min(value):.3f} to {max(value):.3f} (in label id order), "
            f"{source}"
        )
    return f"- Decision threshold: {float(value):.3f} for every label, {source}"


REMOTE_CODE = "the model code beside the weights (vit-ft's ViT)"


def _multilabel_usage(where: str, model: str, format: str, threshold: Any) -> str:
    """A multi-label model through `pipeline()`: every label's sigmoid score (`top_k=num_labels`), keeping those at or
    above the decision threshold that config.json holds (one for every label, or one per label)."""
    remote = ", trust_remote_code=True" if format == "vit_ft" else ""
    if isinstance(threshold, list):
        keep = (
            "thresholds = classifier.model.config.decision_threshold  # one per label, in label id order\n"
            "label2id = classifier.model.config.label2id\n"
            'labels = [s["label"] for s in scores if s["score"] >= thresholds[label2id[s["label"]]]]\n'
        )
    else:
        keep = (
            f'threshold = getattr(classifier.model.config, "decision_threshold", {DEFAULT_THRESHOLD})'
            "  # one for every label\n"
            'labels = [s["label"] for s in scores if s["score"] >= threshold]\n'
        )
    return (
        "```python\nfrom transformers import pipeline\n\n"
        f'{where}classifier = pipeline("image-classification", model={model}{remote})\n'
        "# every label with its sigmoid probability (top_k=None would mean the pipeline's default, 5)\n"
        'scores = classifier("image.jpg", top_k=classifier.model.config.num_labels)\n'
        f"{keep}```\n\n"
        "config.json says `problem_type: multi_label_classification`, so `pipeline()` applies a sigmoid to each "
        "logit: the scores are independent and do not sum to 1. Keep the labels at or above the decision "
        "threshold (`decision_threshold` in config.json, stated above); an image may have none."
        + (f" `trust_remote_code=True` runs {REMOTE_CODE}." if remote else "")
    )


__all__ = ["is_multi_label_run", "model_card", "write_model_card"]
