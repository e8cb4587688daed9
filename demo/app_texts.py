"""What the demo's page says: the answer's status line (the top label and how sure the model is, a multi-label
model's labels against their decision thresholds), the warning for an upload unlike the training images, an
example's caption, and the text at the top of the page. Plain functions of numbers and names (no model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vit_ft.metrics.multilabel import THRESHOLD_ATTRIBUTE
from vit_ft.tasks.temperature import UNSURE_BELOW

LOW_CONFIDENCE = UNSURE_BELOW  # a top-1 probability (calibrated) below this is reported as unsure (the card too)
BELOW_SHOWN = 3  # a multi-label answer also shows this many labels under their thresholds: the near misses


def describe_prediction(label: str, probability: float, num_classes: int, temperature: float) -> str:
    """The status line of an answer: the label and its probability, and a warning below LOW_CONFIDENCE."""
    calibrated = (
        f"calibrated, temperature {temperature:.2f}" if temperature != 1.0 else "no temperature fitted"
    )
    line = f"**{label}**: {100 * probability:.0f} % ({calibrated})."
    if probability >= LOW_CONFIDENCE:
        return line
    return (
        f"{line}\n\n**Unsure:** the top probability is below {100 * LOW_CONFIDENCE:.0f} %. The model only knows "
        f"its {num_classes} classes: this image may show none of them, or look unlike its training images."
    )


def describe_unlike(score: float, ood: dict[str, Any], expected: str) -> str:
    """The warning for an upload the feature bank marks as unlike the training images (`ood`: the bank's fit on
    validation), and what to upload instead."""
    return (
        f"**This does not look like the training images:** it is {score:.1f}x further from its nearest training "
        f"images, in the model's feature space, than {100 * ood['quantile']:g} % of the {ood['split']} images are. "
        f"The answer above may mean little. The model expects {expected}, like the examples."
    )


def threshold_source(config: Any, record: dict | None) -> str:
    """Where a multi-label model's decision threshold comes from, in words for the page."""
    if getattr(config, THRESHOLD_ATTRIBUTE, None) is None:
        return "the default: none was tuned"
    entry = (record or {}).get(THRESHOLD_ATTRIBUTE) or {}  # the fine-tune's `kind` says how it chose it
    if entry.get("kind") in ("global", "per_class"):
        return f"tuned on the {entry.get('split') or 'validation'} split"
    return {"fixed": "fixed by the recipe", "default": "the default: no validation split to tune it on"}.get(
        entry.get("kind"), "from the model's config"
    )


def describe_threshold(thresholds: dict[str, float], source: str) -> str:
    """The decision threshold in words: one for every label, or the range of the per-label ones."""
    values = sorted(set(thresholds.values()))
    if len(values) == 1:
        return f"decision threshold {100 * values[0]:.1f} % ({source})"
    return f"per-label decision thresholds, {100 * values[0]:.1f} to {100 * values[-1]:.1f} % ({source})"


def describe_labels(confidences: list[dict], thresholds: dict[str, float], source: str) -> str:
    """The status line of a multi-label answer (`shown_labels`, as gr.Label returns it): the labels at or above
    their thresholds, or that there is none, then the ones below, marked as not predicted."""
    shared = len(set(thresholds.values())) == 1

    def item(entry: dict) -> str:
        own = "" if shared else f" (threshold {100 * thresholds[entry['label']]:.1f} %)"
        return f"{entry['label']} {100 * entry['confidence']:.1f} %{own}"

    above = [e for e in confidences if e["confidence"] >= thresholds[e["label"]]]
    below = [e for e in confidences if e["confidence"] < thresholds[e["label"]]]
    rule = describe_threshold(thresholds, source)
    if above:
        line = f"**{len(above)} label{'s' * (len(above) != 1)}** at or above the {rule}: " + ", ".join(
            f"**{item(e)}**" for e in above
        )
    else:
        line = (
            f"**No label above threshold** ({rule}): the model predicts none of its {len(thresholds)} labels."
        )
    if below:
        line += "\n\nBelow the threshold, not predicted: " + ", ".join(f"_{item(e)}_" for e in below)
    return line


def example_caption(path: str) -> str:
    """An example's label from its file name, `NN_<label>.<ext>` (`reports.examples.write_examples`)."""
    stem = Path(path).stem
    number, _, label = stem.partition("_")
    return label if number.isdigit() and label else stem


def introduction(classifier: Any) -> str:
    """The text at the top of the page: the model, what an answer shows and how sure it is."""
    count, (height, width) = len(classifier.labels), classifier.size
    if not classifier.multi_label:
        return (
            f"## {classifier.name}\nA ViT fine-tuned with vit-ft: {count} classes at {height}x{width}. Upload an "
            "image or click an example for the top-5 labels and an attention-rollout map (Abnar & Zuidema 2020) of "
            f"where the class token's information comes from. The model only knows its {count} classes; a top "
            f"probability under {100 * LOW_CONFIDENCE:.0f} % is flagged as unsure.\n\n{expectation(classifier)}"
        )
    return (
        f"## {classifier.name}\nA multi-label ViT fine-tuned with vit-ft: {count} labels at {height}x{width}. "
        "Upload an image or click an example for the labels it shows, several or none: each label's probability "
        "is the sigmoid of its logit, independent of the others, and a label is predicted at or above the "
        f"{describe_threshold(classifier.thresholds, classifier.threshold_source)}; the {BELOW_SHOWN} most "
        "probable labels below it are shown too, marked as not predicted. The attention-rollout map (Abnar & "
        "Zuidema 2020) of where the class token's information comes from is class-agnostic: one map for the "
        f"image, the same for every label.\n\n{expectation(classifier)}"
    )


def expectation(classifier: Any) -> str:
    """What input the model expects, and whether an upload unlike the training images is flagged."""
    if classifier.bank is None:
        return f"**Expected input:** {classifier.expected}. {classifier.bank_note}"
    return (
        f"**Expected input:** {classifier.expected}, like the examples. An upload unlike the training images "
        "(far from all of them in the model's feature space) is flagged, whatever its probabilities."
    )


__all__ = [
    "BELOW_SHOWN",
    "LOW_CONFIDENCE",
    "describe_labels",
    "describe_prediction",
    "describe_threshold",
    "describe_unlike",
    "example_caption",
    "expectation",
    "introduction",
    "threshold_source",
]
