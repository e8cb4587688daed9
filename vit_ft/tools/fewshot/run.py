"""Few-shot linear evaluation, as the ViT paper judges pre-trained checkpoints (arXiv 2010.11929, §4.1).

The features are frozen and pre-logit (`features`). For k images per class of the training split (`sampling`),
a regularised least-squares fit maps them to {-1, 1}^K targets in closed form (`probe`); its accuracy on the
test split (`data`) is the score, averaged over seeds. The regularisation strength is chosen from a grid by
accuracy on a held-out part of train, disjoint from the k-shot images. `run_fewshot` puts them together and
writes the report (`vit_ft.reports.fewshot`).

    run_fewshot("outputs/digits-pretrained", "data/digits", "reports/fewshot")      # train/ and test/ folders
    run_fewshot("google/vit-base-patch16-224-in21k", FewShotSource("uoft-cs/cifar10", image_column="img"),
                "reports/c10", FewShotOptions(shots=(1, 5), seeds=5))
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ...data.images import describe_source
from ...kernels import kernelize
from ...model.modeling_vit_ft import ViTFTForImageClassification
from ...reports.fewshot import OUTPUT_FILES, write_fewshot_report
from ...tasks.probes import knn_probabilities
from ...utils.limits import MAX_IMAGE_TOKENS
from ...utils.output_dir import OutputFiles, check_output_dir
from ..inference import BF16_CHOICES
from ..trained import Trained, load_trained
from .data import FewShotData, FewShotSource, load_fewshot_data
from .features import extract_features
from .probe import L2_GRID, fit_least_squares, select_l2
from .sampling import FewShotDraw, draw_fewshot

logger = logging.getLogger("vit_ft")
FEWSHOT_FILES = OutputFiles("fewshot", OUTPUT_FILES, "a few-shot report")  # only these replaced, others kept

DEFAULT_SHOTS = (1, 5, 10, 25)  # the ViT paper's Table/Figure few-shot settings


@dataclass(frozen=True)
class FewShotOptions:
    """How a few-shot evaluation runs. The protocol: `shots` (images per class, each k evaluated), `seeds` (draws
    0 .. seeds-1), the held-out part for choosing l2 (`holdout_fraction` of each class, at most
    `max_holdout_per_class`), the `l2_grid` to choose from (one value: no selection), `random_init` (fresh
    weights of the same architecture: the baseline). The features: `image_size` (bounded by `max_tokens` patch
    tokens), `batch_size`, `device`, `bf16` ("auto", "true", "false"; see `inference.use_bf16`), `num_workers`
    decoding threads, `progress` bars. Meaningless settings are a ValueError before any model or data loads."""

    shots: Sequence[int] = DEFAULT_SHOTS
    seeds: int = 3
    holdout_fraction: float = 0.2
    max_holdout_per_class: int = 50
    l2_grid: Sequence[float] = L2_GRID
    random_init: bool = False
    image_size: int | Sequence[int] | None = None
    max_tokens: int | None = MAX_IMAGE_TOKENS
    batch_size: int = 64
    device: str | None = None
    bf16: str | bool = "auto"
    num_workers: int = 0
    progress: bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shots", tuple(sorted(set(int(k) for k in self.shots))))
        object.__setattr__(self, "l2_grid", tuple(float(v) for v in self.l2_grid))
        if not self.shots or min(self.shots) < 1:
            raise ValueError(f"shots={list(self.shots)} must be positive numbers of images per class.")
        if not self.l2_grid or min(self.l2_grid) <= 0 or not np.isfinite(self.l2_grid).all():
            raise ValueError(f"l2_grid={list(self.l2_grid)} must be positive regularisation strengths.")
        if self.seeds < 1:
            raise ValueError(
                f"--seeds {self.seeds} must be at least 1 (the number of random draws of the k-shot images)."
            )
        if not 0 < self.holdout_fraction < 1:
            raise ValueError(
                f"--holdout_fraction {self.holdout_fraction} must be between 0 and 1 (the part of each class held "
                "out for choosing the regularisation), e.g. 0.2."
            )
        if self.max_holdout_per_class < 1:
            raise ValueError(f"--max_holdout_per_class {self.max_holdout_per_class} must be at least 1.")
        if not isinstance(self.bf16, bool) and self.bf16 not in BF16_CHOICES:
            raise ValueError(f"--bf16 {self.bf16} must be one of {', '.join(BF16_CHOICES)}.")


@dataclass
class ShotResult:
    """One k: test accuracy, chosen l2 and its held-out accuracy for each seed; the kNN evaluator's test accuracy
    (DINOv2's weighted vote over the same k-shot images) for each seed."""

    shots: int
    accuracies: list[float] = field(default_factory=list)
    l2: list[float] = field(default_factory=list)
    holdout_accuracies: list[float] = field(default_factory=list)
    knn_accuracies: list[float] = field(default_factory=list)

    @property
    def mean(self) -> float:
        return float(np.mean(self.accuracies))

    @property
    def std(self) -> float:
        """Sample standard deviation over seeds (ddof=1); 0 for a single seed."""
        return float(np.std(self.accuracies, ddof=1)) if len(self.accuracies) > 1 else 0.0

    def as_record(self) -> dict[str, Any]:
        """This k's entry of fewshot.json's `results`."""
        return {
            "shots": self.shots,
            "mean_accuracy": self.mean,
            "std_accuracy": self.std,
            "accuracies": self.accuracies,
            "l2": self.l2,
            "holdout_accuracies": self.holdout_accuracies,
            "knn_mean_accuracy": float(np.mean(self.knn_accuracies)) if self.knn_accuracies else None,
            "knn_accuracies": self.knn_accuracies,
        }


def _train_features(
    data: FewShotData,
    draws: Callable[[np.ndarray], list[FewShotDraw]],
    extract: Callable[[Sequence[Any], str], tuple[np.ndarray, dict[int, str]]],
) -> tuple[np.ndarray, list[FewShotDraw], list[dict[str, Any]]]:
    """Features of only the training rows the draws use (held-out and k-shot rows of every seed), each
    extracted once; a row that does not decode is excluded and the draws are made again without it."""
    num_train = len(data.train_labels)
    features: np.ndarray | None = None
    done = np.zeros(num_train, dtype=bool)
    bad: dict[int, str] = {}
    while True:
        drawn = draws(np.asarray(sorted(bad), dtype=np.int64))
        used = np.unique(np.concatenate([np.concatenate([d.holdout, *d.shots.values()]) for d in drawn]))
        todo = used[~done[used]]
        if len(todo) == 0:
            break
        values, errors = extract([data.train_images[int(i)] for i in todo], "Train features")
        if features is None:
            features = np.zeros((num_train, values.shape[1]), dtype=np.float32)
        features[todo] = values
        done[todo] = True
        bad.update({int(todo[offset]): reason for offset, reason in errors.items()})
    skipped = [
        {"split": "train", "source": describe_source(data.train_images[row]), "reason": reason}
        for row, reason in sorted(bad.items())
    ]
    return features, drawn, skipped


def evaluate_fewshot(
    train_features: np.ndarray,
    train_labels: np.ndarray,
    test_features: np.ndarray,
    test_labels: np.ndarray,
    num_classes: int,
    draws: Sequence[FewShotDraw],
    l2_grid: Sequence[float] = L2_GRID,
) -> list[ShotResult]:
    """For each k and draw: fit on the k-shot rows, choose l2 on the held-out rows, score on the test set; and
    the kNN evaluator (`tasks.probes.knn_probabilities`: k = 20 neighbours, T = 0.07) on the same rows."""
    results = {k: ShotResult(k) for k in sorted(draws[0].shots)}
    for draw in draws:
        for k, rows in draw.shots.items():
            fit = fit_least_squares(train_features[rows], train_labels[rows], num_classes)
            l2, held = select_l2(fit, train_features[draw.holdout], train_labels[draw.holdout], l2_grid)
            results[k].accuracies.append(fit.accuracy(test_features, test_labels, l2))
            results[k].l2.append(l2)
            results[k].holdout_accuracies.append(held)
            votes = knn_probabilities(test_features, train_features[rows], train_labels[rows], num_classes)
            results[k].knn_accuracies.append(float(np.mean(votes.argmax(axis=1) == np.asarray(test_labels))))
    return list(results.values())


def random_init_model(config: Any, seed: int = 0) -> torch.nn.Module:
    """A model of `config`'s size and shape with freshly initialised weights (the baseline pre-training is
    judged against), seeded, with the CPU kernels as loaded models have them."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return kernelize(ViTFTForImageClassification(config)).eval()


def _features(
    trained: Trained, data: FewShotData, options: FewShotOptions
) -> tuple[np.ndarray, np.ndarray, list[FewShotDraw], np.ndarray, list[dict[str, Any]]]:
    """Train features (only the rows the draws use), test features, the draws, which test rows decoded, and the
    images skipped because they do not decode. A class too small for the largest k fails before any decoding."""

    def draws(excluded: np.ndarray) -> list[FewShotDraw]:
        return [
            draw_fewshot(data.train_labels, len(data.names), options.shots, seed, options.holdout_fraction,
                         options.max_holdout_per_class, excluded, data.names)
            for seed in range(options.seeds)
        ]  # fmt: skip

    def extract(images: Sequence[Any], desc: str) -> tuple[np.ndarray, dict[int, str]]:
        return extract_features(
            trained, images, options.batch_size, options.num_workers, trained.bf16, desc, options.progress
        )

    draws(np.zeros(0, dtype=np.int64))
    train, drawn, skipped = _train_features(data, draws, extract)
    test, test_errors = extract(data.test_images, "Test features")
    kept = np.array([i not in test_errors for i in range(len(data.test_labels))], dtype=bool)
    skipped += [
        {"split": "test", "source": describe_source(data.test_images[i]), "reason": reason}
        for i, reason in sorted(test_errors.items())
    ]
    if skipped:
        first = skipped[0]
        logger.warning(
            "Skipped %d images that do not decode, e.g. %s (%s).",
            len(skipped),
            first["source"],
            first["reason"],
        )
    return train, test, drawn, kept, skipped


def _record(
    trained: Trained,
    data: FewShotData,
    options: FewShotOptions,
    *,
    num_test_images: int,
    feature_dim: int,
    holdout_images: int,
    feature_seconds: float,
    results: list[ShotResult],
    skipped: list[dict[str, Any]],
) -> dict[str, Any]:
    """fewshot.json: what was evaluated on what, with which settings, and the results."""
    return {
        "model": trained.source,
        "random_init": options.random_init,
        "dataset": data.description,
        "num_classes": len(data.names),
        "num_test_images": num_test_images,
        "num_train_images": len(data.train_labels),
        "feature_dim": feature_dim,
        "image_size": list(trained.preprocessing.image_size),
        "bf16": trained.bf16,
        "device": str(trained.device),
        "seeds": options.seeds,
        "holdout_fraction": options.holdout_fraction,
        "max_holdout_per_class": options.max_holdout_per_class,
        "holdout_images": holdout_images,
        "l2_grid": list(options.l2_grid),
        "feature_seconds": feature_seconds,
        "results": [r.as_record() for r in results],
        "skipped": skipped,
    }


def run_fewshot(
    model: str | os.PathLike,
    dataset: str | os.PathLike | FewShotSource,
    output_dir: str | os.PathLike,
    options: FewShotOptions | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Few-shot linear accuracy of `model`'s frozen features on `dataset` (a FewShotSource, or a folder with
    train/ and test/, a save_to_disk folder or a Hub dataset id) for each k of `options.shots`; writes
    fewshot.md, fewshot.json and fewshot.png to `output_dir` and returns the JSON record. Everything is
    checked before any image decodes, and nothing is written until the end; then only those three files
    are replaced in `output_dir` (`FEWSHOT_FILES`: one it did not write only with `overwrite`), its others
    kept."""
    options = options or FewShotOptions()
    source = dataset if isinstance(dataset, FewShotSource) else FewShotSource(dataset)
    # not inside the model or the dataset: a fewshot.png in a class folder would become a training image
    out = check_output_dir(output_dir, inputs=[model, source.dataset], holds=", ".join(OUTPUT_FILES))
    FEWSHOT_FILES.check(out, overwrite)
    trained = load_trained(model, options.image_size, options.device, max_tokens=options.max_tokens,
                           require_head=False, bf16=options.bf16)  # fmt: skip
    if options.random_init:
        trained.model = random_init_model(trained.model.config).to(trained.device)
    data = load_fewshot_data(source)
    logger.info(
        "Few-shot evaluation of %s%s on %s: %d classes, shots %s, %d seed(s), bf16 %s.", trained.source,
        " (randomly initialised)" if options.random_init else "", data.description, len(data.names),
        ",".join(map(str, options.shots)), options.seeds, "on" if trained.bf16 else "off",
    )  # fmt: skip
    started = time.perf_counter()
    train, test, drawn, kept, skipped = _features(trained, data, options)
    seconds = time.perf_counter() - started
    results = evaluate_fewshot(train, data.train_labels, test[kept], data.test_labels[kept], len(data.names),
                               drawn, options.l2_grid)  # fmt: skip
    record = _record(
        trained, data, options, num_test_images=int(kept.sum()), feature_dim=int(train.shape[1]),
        holdout_images=int(len(drawn[0].holdout)), feature_seconds=round(seconds, 2),
        results=results, skipped=skipped,
    )  # fmt: skip
    with FEWSHOT_FILES.staged(out, overwrite) as staging:
        write_fewshot_report(staging, record)
    return record


__all__ = [
    "DEFAULT_SHOTS",
    "FEWSHOT_FILES",
    "FewShotOptions",
    "ShotResult",
    "evaluate_fewshot",
    "random_init_model",
    "run_fewshot",
]
