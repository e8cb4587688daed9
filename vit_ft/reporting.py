"""What a fine-tune leaves for people to read: training curves and the model card."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers
import matplotlib.pyplot as plt  # noqa: E402
from huggingface_hub import EvalResult, ModelCard, ModelCardData  # noqa: E402

EVAL_METRICS = ("eval_accuracy", "eval_top5_accuracy", "eval_f1", "eval_loss")
REPORTED = ("_accuracy", "_f1", "_loss")  # metric-name endings shown in the model card (not runtimes)


def plot_training_curves(log_history: list[dict[str, Any]], path: str | Path) -> Path:
    """One PNG with loss, learning rate and evaluation metrics against the optimizer step."""
    train = [e for e in log_history if "loss" in e and "step" in e]
    evals = [e for e in log_history if "eval_loss" in e and "step" in e]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    loss_ax, lr_ax, metric_ax = axes
    if train:
        loss_ax.plot([e["step"] for e in train], [e["loss"] for e in train], label="train loss")
    if evals:
        loss_ax.plot([e["step"] for e in evals], [e["eval_loss"] for e in evals], "o-", label="eval loss")
    loss_ax.set(title="Loss", xlabel="step")
    loss_ax.legend()
    lr = [e for e in train if "learning_rate" in e]
    lr_ax.plot([e["step"] for e in lr], [e["learning_rate"] for e in lr])
    lr_ax.set(title="Learning rate", xlabel="step")
    for key in EVAL_METRICS[:3]:
        points = [e for e in evals if key in e]
        if points:
            metric_ax.plot(
                [e["step"] for e in points], [e[key] for e in points], "o-", label=key.removeprefix("eval_")
            )
    metric_ax.set(title="Evaluation", xlabel="step", ylim=(0, 1.02))
    if evals:
        metric_ax.legend()
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_model_card(output_dir: str | Path, run_info: dict[str, Any]) -> Path:
    """README.md with YAML metadata (license, library, tags, datasets, base model, model-index results)."""
    output_dir = Path(output_dir)
    metrics = run_info.get("metrics", {})
    data = run_info.get("data", {})
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
            metric_type=name,
            metric_value=float(metrics[prefix + name]),
        )
        for name in ("accuracy", "top5_accuracy", "f1")
        if prefix + name in metrics
    ]
    name = output_dir.name
    base = run_info.get("base_model")
    card_data = ModelCardData(
        license="apache-2.0",
        library_name="transformers",
        tags=[
            "vit_ft",
            "vision",
            "image-classification",
            "lora" if run_info.get("lora") else "full-fine-tuning",
        ],
        datasets=[data["dataset_name"]] if data.get("dataset_name") else None,
        base_model=base if base and not Path(base).exists() else None,
        metrics=["accuracy", "f1"],
        model_name=name,
        eval_results=results or None,
    )
    height, width = run_info.get("image_size") or (None, None)
    rows = "\n".join(
        f"| {k} | {v:.4f} |"
        for k, v in sorted(metrics.items())
        if isinstance(v, float) and k.endswith(REPORTED)
    )
    content = f"""---
{card_data.to_yaml()}
---

# {name}

A Vision Transformer fine-tuned with vit-ft ({"LoRA" if run_info.get("lora") else "full fine-tuning"}).

- Recipe: `{run_info.get("recipe")}`
- Base model: `{base}`
- Resolution: {height}x{width}
- Dataset: `{dataset_id}`

## Results

| metric | value |
| --- | --- |
{rows}

## Use

```python
from transformers import AutoModelForImageClassification
model = AutoModelForImageClassification.from_pretrained("{name}", trust_remote_code=True)
```

![training curves](training_curves.png)

Run settings: see `vit_ft_run.json`.
"""
    path = output_dir / "README.md"
    ModelCard(content).save(path)
    return path


__all__ = ["plot_training_curves", "write_model_card"]
