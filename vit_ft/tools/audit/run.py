"""`vit-ft audit`: wrong labels, duplicates, leaks and outliers of a dataset, found with a model's frozen features.

One pass of the model over every image gives both feature spaces of the feature bank (`tasks.feature_bank`);
the detectors (`findings`) work on them and on small pixel descriptors; the report (`reports.audit`) writes
findings.csv, relabel.csv (for `exclude:` in the fine-tune, `data.exclusions`), report.md and one image grid
per kind, replacing only the audit's own files in the output folder (`AUDIT_FILES`).

    record = run_audit("outputs/digits-pretrained", AuditSource("data/digits"), "reports/audit")
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from ...data.exclusions import image_key
from ...data.images import load_image
from ...data.multilabel import is_multi_hot, multi_hot_matrix
from ...reports.audit import OUTPUT_FILES, AuditImage, write_audit_report
from ...tasks.feature_bank import FeatureBank, bank_features, normalized
from ...utils.hub_ids import check_reference
from ...utils.limits import MAX_IMAGE_TOKENS
from ...utils.output_dir import OutputFiles, check_output_dir
from ..splits import is_image_folders, load_named_splits
from ..trained import load_trained
from .findings import (
    FOLDS,
    Finding,
    copies,
    disagreements,
    outlier_scores,
    outliers,
    pixel_descriptor,
    require_cleanlab,
)
from .finetune import OofFinetune, check_fold_flags, fold_finetune_probabilities
from .labels import NoiseEstimate, cleanlab_default, label_issues, quality_record, self_check
from .multilabel import multilabel_issues, multilabel_probabilities, multilabel_self_check
from .probes import Source, best_probe, pixel_space, probe_probabilities

logger = logging.getLogger("vit_ft")
AUDIT_FILES = OutputFiles("audit", OUTPUT_FILES, "a data audit")  # only these replaced, others kept
HELD_OUT = ("validation", "test")


@dataclass(frozen=True)
class AuditSource:
    """The data audited: a folder with train/ (and validation/, test/ to search for leaks) image folders, a
    save_to_disk folder or a Hub dataset id, with its configuration, split names and columns."""

    dataset: str | os.PathLike
    dataset_config: str | None = None
    train_split: str = "train"
    validation_split: str | None = None
    test_split: str | None = "test"
    image_column: str = "image"
    label_column: str = "label"


@dataclass(frozen=True)
class AuditOptions:
    """How the audit runs: `folds` of the out-of-fold probes, the data `seed` of the folds, the model's settings
    as every tool takes them, and `oof`: k-fold fine-tunes as one more candidate (`--oof finetune`; None: the
    probes alone)."""

    folds: int = FOLDS
    seed: int = 0
    image_size: int | Sequence[int] | None = None
    max_tokens: int | None = MAX_IMAGE_TOKENS
    batch_size: int = 64
    device: str | None = None
    bf16: str | bool = "auto"
    oof: OofFinetune | None = None

    def __post_init__(self) -> None:
        if self.folds < 2:
            raise ValueError(f"--folds {self.folds} must be at least 2 (each image is scored by a probe fitted on "
                             "the other folds), e.g. --folds 5.")  # fmt: skip
        if self.batch_size < 1:
            raise ValueError(f"--batch_size {self.batch_size} must be at least 1.")


def load_audit_data(source: AuditSource) -> tuple[dict[str, Any], list[str], str]:
    """{split: Dataset with undecoded "image" and "label"} (train, and validation / test where present) and the
    class names; fewer than two classes, or a class with fewer images than folds, is a ValueError."""
    import datasets

    from ...data.datasets import load_image_datasets

    root = Path(source.dataset).expanduser()
    if is_image_folders(root):
        if not (root / "train").is_dir():
            raise FileNotFoundError(
                f"--dataset {source.dataset} has no train/ folder; the audit reads {source.dataset}/train/<class "
                "name>/<image> (and validation/, test/ beside it, searched for leaks)."
            )
        folders = {split: root / split if (root / split).is_dir() else None for split in HELD_OUT}
        splits, names = load_image_datasets(train_dir=root / "train", validation_dir=folders["validation"],
                                            test_dir=folders["test"], validation_split_percentage=0)  # fmt: skip
        description = f"image folders {os.fspath(source.dataset)}"
    else:
        expected = "a folder with train/ (and validation/, test/) image folders, a save_to_disk folder or a Hub dataset id"
        check_reference(source.dataset, f"--dataset {source.dataset}", expected, repo_type="dataset")
        splits, names = load_named_splits(source)
        description = f"dataset {os.fspath(source.dataset)}"
    if len(names) < 2:
        raise ValueError(
            f"--dataset {source.dataset} has {len(names)} class ({names}); label issues need at least two classes. "
            "Add the images of the other classes."
        )
    undecoded = {split: ds.cast_column("image", datasets.Image(decode=False)) for split, ds in splits.items()}
    return undecoded, list(names), description


def _pixels(images: Sequence[Any]) -> np.ndarray:
    """`(n, PIXEL_SIZE**2)` pixel descriptors (a zero row for an image that does not decode)."""
    rows = []
    for image in images:
        try:
            rows.append(pixel_descriptor(load_image(image)))
        except Exception:  # noqa: BLE001 - an image that does not decode matches nothing
            rows.append(None)
    size = next((len(r) for r in rows if r is not None), 1)
    return np.stack([r if r is not None else np.zeros(size, np.float32) for r in rows])


def _check_classes(labels: np.ndarray, names: list[str], folds: int, dataset: Any, multi: bool = False) -> None:
    counts = labels.sum(axis=0) if multi else np.bincount(labels, minlength=len(names))
    small = [names[i] for i in np.flatnonzero(counts < folds)]
    if small:
        raise ValueError(
            f"--dataset {dataset}: class(es) {small[:10]} have fewer training images than --folds {folds}; add "
            "images, or lower --folds (at least 2)."
        )


def _held_out_features(
    trained: Any, held: dict[str, Any], batch_size: int
) -> tuple[dict[str, dict[str, np.ndarray]], dict[str, list[Any]]]:
    """Each held-out split's features and pixel descriptors (what a training image's copy or leak is searched
    among), and its images that decode."""
    held_values: dict[str, dict[str, np.ndarray]] = {}
    held_images: dict[str, list[Any]] = {}
    for split, dataset in held.items():
        values, held_kept = bank_features(trained.model, trained.transform, dataset["image"], batch_size,
                                          f"Features ({split})")  # fmt: skip
        held_images[split] = [dataset["image"][i] for i in held_kept]
        held_values[split] = {"features": values["features"], "pixels": _pixels(held_images[split])}
    return held_values, held_images


def _audit_images(
    found: list[Any], images: list[Any], kept: list[int], held_images: dict[str, list[Any]]
) -> list[AuditImage]:
    """Each finding with its image and key (and for a copy or leak, the other image's), as the report shows it."""
    split_images = {"train": images, **held_images}
    split_rows = {"train": kept, **{split: range(len(values)) for split, values in held_images.items()}}

    def located(split: str, index: int) -> tuple[Any, str]:
        image = split_images[split][index]
        path = image.get("path") if isinstance(image, dict) else None
        return image, image_key(path, split_rows[split][index], split)

    return [AuditImage(finding, *located(finding.split, finding.index),
                       *(located(finding.other_split, finding.other_index) if finding.other_split else (None, "")))
            for finding in found]  # fmt: skip


def audit_labels(
    spaces: Mapping[str, np.ndarray] | np.ndarray, labels: np.ndarray, num_classes: int, folds: int = FOLDS,
    seed: int = 0, extra: Mapping[str, Source] | None = None, pick: str | None = None,
) -> tuple[list[Finding], dict[str, Any], np.ndarray]:  # fmt: skip
    """The label issues of images with given `labels`, from `{space: (n, d)}` features (a bare array: the pooled
    "features"; "pixels": the raw-pixel anchor) and the `extra` candidates (`--oof finetune`'s): the best
    candidate's out-of-fold probabilities (`probes.best_probe`), the flags bounded by confident learning's noise
    estimate, and the self-check on a copy with known flips (`labels.self_check`, the chosen candidate run again:
    its probe on its space, or its fine-tunes; `pick`: a candidate taken whatever its log-loss). Returns the
    flags, {"probe", "quality"} for the record, and the out-of-fold probabilities."""
    spaces = {"features": spaces} if isinstance(spaces, np.ndarray) else spaces
    extra = extra or {}
    probabilities, probe = best_probe(spaces, labels, num_classes, folds, seed, extra=extra, pick=pick)
    found, estimate = label_issues(labels, probabilities)

    def rerun(flipped: np.ndarray) -> np.ndarray:
        if probe["chosen"] in extra:
            return extra[str(probe["chosen"])](flipped, "self-check")
        return probe_probabilities(str(probe["probe"]), spaces[str(probe["space"])], flipped, num_classes, folds, seed)

    check = self_check(labels, found, num_classes, rerun, seed=seed)
    return found, {"probe": probe, "quality": quality_record(probe, estimate, check, found)}, probabilities


def audit_multilabel_labels(
    spaces: Mapping[str, np.ndarray], matrix: np.ndarray, folds: int = FOLDS, seed: int = 0
) -> tuple[list[Finding], dict[str, Any], np.ndarray]:
    """`audit_labels` for multi-label data (`(n, num_labels)` multi-hot `matrix`): one-vs-rest probes, cleanlab's
    multi-label filter and the same self-check on flipped labels (`multilabel`)."""
    probabilities, probe = multilabel_probabilities(spaces, matrix, folds, seed)
    issues = multilabel_issues(matrix, probabilities)
    found = [Finding("train", i.index, "label_issue", i.score, i.given, i.suggested) for i in issues]

    def rerun(flipped: np.ndarray) -> np.ndarray:
        return multilabel_probabilities({str(probe["space"]): spaces[str(probe["space"])]}, flipped, folds, seed)[0]

    check = multilabel_self_check(matrix, found, rerun, seed=seed)
    estimate = NoiseEstimate(len(found), len(matrix))
    return found, {"probe": probe, "quality": quality_record(probe, estimate, check, found)}, probabilities


def _label_findings(
    spaces: Mapping[str, np.ndarray], labels: np.ndarray, multi: bool, num_classes: int, options: AuditOptions,
    extra: Mapping[str, Source] | None = None,
) -> tuple[list[Finding], dict[str, Any], np.ndarray, np.ndarray]:  # fmt: skip
    """The label issues (`audit_labels`, or `audit_multilabel_labels` for a multi-hot `labels` matrix), their record,
    and the comparisons' `(n,)` flags: cleanlab's default filter (single-label only), most probable != given."""
    if multi:
        found, record, probabilities = audit_multilabel_labels(spaces, labels, options.folds, options.seed)
        return found, record, np.zeros(len(labels), bool), ((probabilities > 0.5) != labels).any(axis=1)
    pick = options.oof.name if options.oof is not None and options.oof.pick == "finetune" else None
    found, record, probabilities = audit_labels(spaces, labels, num_classes, options.folds, options.seed, extra, pick)
    return found, record, cleanlab_default(labels, probabilities), disagreements(labels, probabilities)


def _finetune_sources(
    options: AuditOptions, model: str | os.PathLike, images: list[Any], names: list[str]
) -> dict[str, Source]:
    """`--oof finetune`'s candidate (`finetune.fold_finetune_probabilities` on these images), or none."""
    oof = options.oof
    if oof is None:
        return {}

    def finetuned(labels: np.ndarray, what: str) -> np.ndarray:
        return fold_finetune_probabilities(oof, str(model), images, labels, names, options.folds, options, what)

    return {oof.name: finetuned}


def _check_options(options: AuditOptions, model: str | os.PathLike, multi: bool) -> None:
    """What the options ask of this data and model, before the model loads: `--oof finetune` on single-label
    data, its fine-tune flags a valid fine-tune (`finetune.check_fold_flags`)."""
    if options.oof is None:
        return
    if multi:
        raise ValueError("--oof finetune audits single-label data; a multi-label dataset is audited with the probes "
                         "(leave out --oof).")  # fmt: skip
    check_fold_flags(options.oof, str(model), options)


def _record(
    trained: Any, description: str, names: list[str], images: list[Any], kept: list[int], train: Any,
    held_images: dict[str, list[Any]], options: AuditOptions, comparisons: tuple[Any, ...],
) -> dict[str, Any]:  # fmt: skip
    """audit.json's contents before the counts: what was audited, the label record, the comparisons (cleanlab's
    default filter on the same probabilities, single-label; most probable class != label)."""
    label_record, cleanlab, disagree, multi, feature_seconds = comparisons
    return {
        "model": trained.source, "dataset": description, "classes": names, "num_train_images": len(images),
        "held_out": {split: len(values) for split, values in held_images.items()},
        "skipped": len(train) - len(kept), "folds": options.folds, "seed": options.seed, **label_record,
        "multi_label": multi, "disagreements": int(disagree.sum()),
        "compared": {"cleanlab": [image_key(images[i].get("path"), kept[i]) for i in np.flatnonzero(cleanlab)],
                     "most_probable_not_given": [image_key(images[i].get("path"), kept[i])
                                                 for i in np.flatnonzero(disagree)]},
        "feature_seconds": round(feature_seconds, 2), "counts": {},
        "oof_finetune": None if options.oof is None else {"method": options.oof.method, "steps": options.oof.steps,
                                                          "flags": list(options.oof.flags), "pick": options.oof.pick},
    }  # fmt: skip


def run_audit(
    model: str | os.PathLike,
    source: AuditSource | str | os.PathLike,
    output_dir: str | os.PathLike,
    options: AuditOptions | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Audit `source`'s training images with `model`'s frozen features (and with `options.oof`, k-fold
    fine-tunes of it); write findings.csv, relabel.csv, report.md, audit.json and the grids to `output_dir` (only
    the audit's own files replaced) and return the record (audit.json's contents)."""
    options = options or AuditOptions()
    source = source if isinstance(source, AuditSource) else AuditSource(source)
    require_cleanlab()
    out = check_output_dir(output_dir, inputs=[model, source.dataset], holds=", ".join(OUTPUT_FILES))
    AUDIT_FILES.check(out, overwrite)
    splits, names, description = load_audit_data(source)
    train, multi = splits["train"], is_multi_hot(splits["train"].features)
    labels = multi_hot_matrix(train).astype(np.int64) if multi else np.asarray(train["label"], np.int64)
    _check_classes(labels, names, options.folds, source.dataset, multi)
    _check_options(options, model, multi)
    trained = load_trained(model, options.image_size, options.device, max_tokens=options.max_tokens,
                           require_head=False, bf16=options.bf16)  # fmt: skip
    started = time.perf_counter()
    held = {split: splits[split] for split in HELD_OUT if split in splits}
    logger.info("Audit: frozen features of %d training images%s, then %d out-of-fold probes on them.", len(train),
                "".join(f" and {len(d)} {s} images" for s, d in held.items()), options.folds)  # fmt: skip
    features, kept = bank_features(trained.model, trained.transform, train["image"], options.batch_size, "Features")
    if not kept:
        raise ValueError(f"--dataset {source.dataset}: none of the {len(train)} training images decodes.")
    images = [train["image"][i] for i in kept]
    labels = labels[kept]
    classes = np.full(len(kept), -1, np.int64) if multi else labels  # a class per image (none: multi-label)
    bank = FeatureBank(normalized(features["features"]), classes, np.asarray(kept, np.int64),
                       normalized(features["input"]))  # fmt: skip
    held_values, held_images = _held_out_features(trained, held, options.batch_size)
    feature_seconds = time.perf_counter() - started

    pixels = _pixels(images)  # the copies' descriptor, and the raw-pixel anchor among the probes' spaces
    spaces = {"features": features["features"], "pixels": pixel_space(pixels)}
    extra = _finetune_sources(options, model, images, names)
    found, label_record, cleanlab, disagree = _label_findings(spaces, labels, multi, len(names), options, extra)
    found += copies({"features": features["features"], "pixels": pixels}, held_values)
    found += outliers(outlier_scores(bank), classes)
    given = [tuple(np.flatnonzero(row).tolist()) for row in labels] if multi else labels.tolist()
    found = [replace(f, given=given[f.index]) if f.given == -1 else f for f in found]  # copies, outliers: theirs
    record = _record(trained, description, names, images, kept, train, held_images, options,
                     (label_record, cleanlab, disagree, multi, feature_seconds))  # fmt: skip
    rows = _audit_images(found, images, kept, held_images)
    with AUDIT_FILES.staged(out, overwrite) as staging:
        record = write_audit_report(staging, rows, names, record, tuple(trained.preprocessing.image_size))
    logger.info("Audit of %s: %s.", description, ", ".join(f"{n} {k}" for k, n in record["counts"].items()))
    return record


__all__ = ["AUDIT_FILES", "AuditOptions", "AuditSource", "audit_labels", "load_audit_data", "run_audit"]
