"""Few-shot linear evaluation, as the ViT paper judges pre-trained checkpoints (arXiv 2010.11929, §4.1).

The features are frozen and pre-logit: the pooled token that a classification head would see (CLS after
the final LayerNorm, or the patch-token mean for `pooling: mean`). For k images per class of the training
split, a regularised least-squares fit maps them to {-1, 1}^K targets in closed form (the paper: "we solve
a regularized least-squares regression problem that maps the (frozen) representation of a subset of
training images to {-1, 1}^K target vectors"); its accuracy on the test split is the score, averaged over
seeds. As in google-research/big_vision's `fewshot_lsr` evaluator, features are whitened with the k-shot
set's mean and std, a large constant feature carries the bias (so it is barely regularised), and one
eigendecomposition serves every regularisation strength; the strength is chosen from a grid by accuracy on
a held-out part of train, disjoint from the k-shot images.

    run_fewshot("outputs/digits-pretrained", "data/digits", "reports/fewshot")      # train/ and test/ folders
    run_fewshot("google/vit-base-patch16-224-in21k", "uoft-cs/cifar10", "reports/c10", image_column="img")

Writes fewshot.md, fewshot.json and fewshot.png (accuracy against shots) to the output folder.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..data.images import describe_source
from ..model.configuration_vit_ft import MAX_IMAGE_TOKENS
from ..model.modeling_vit_ft import ViTFTForImageClassification
from ..utils.run_record import move_into_place
from .inference import (
    BF16_CHOICES,
    Classifier,
    describe_error,
    iter_batches,
    load_classifier,
    looks_like_path,
    use_bf16,
)

logger = logging.getLogger("vit_ft")

DEFAULT_SHOTS = (1, 5, 10, 25)  # the ViT paper's Table/Figure few-shot settings
BIAS_CONSTANT = 100.0  # the bias feature's value: its weight is penalised 1e4 times less than the others
L2_GRID = tuple(2.0**k for k in range(-10, 21, 2))  # 2^-10 .. 2^20; big_vision's fixed default 2^10 is on it
OUTPUT_FILES = ("fewshot.md", "fewshot.json", "fewshot.png")


# ---- the closed-form least-squares probe -------------------------------------------------------------------


@dataclass
class LeastSquares:
    """A regularised least-squares fit of features to {-1, 1}^K targets, solvable for any l2 in one product.

    With whitened features x (plus the bias column) of shape `(num_points, dim)` and targets y
    `(num_points, num_classes)`, the weights (x^T x + l2 I)^-1 x^T y (or x^T (x x^T + l2 I)^-1 y when
    there are fewer points than dimensions, the usual few-shot case) are `lhs diag(1 / (eigs + l2)) rhs`
    from one eigendecomposition of x^T x (or x x^T).
    """

    mean: np.ndarray  # (1, dim) feature mean of the fitted points
    std: np.ndarray  # (1, dim) feature std of the fitted points (+1e-5 for constant features)
    eigs: np.ndarray  # (rank,) eigenvalues of x^T x or x x^T
    lhs: np.ndarray  # (dim + 1, rank)
    rhs: np.ndarray  # (rank, num_classes)

    def design(self, features: np.ndarray) -> np.ndarray:
        """`(num_points, dim)` features -> whitened `(num_points, dim + 1)` with the constant bias column."""
        x = (np.asarray(features, dtype=np.float64) - self.mean) / self.std
        return np.pad(x, ((0, 0), (0, 1)), constant_values=BIAS_CONSTANT)

    def weights(self, l2: float) -> np.ndarray:
        """The solution for regularisation `l2`, `(dim + 1, num_classes)` (the last row is the bias)."""
        return (self.lhs / (self.eigs + l2)[None, :]) @ self.rhs

    def scores(self, features: np.ndarray, l2: float) -> np.ndarray:
        """`(num_points, dim)` features -> `(num_points, num_classes)` regression outputs."""
        return self.design(features) @ self.weights(l2)

    def accuracy(self, features: np.ndarray, labels: np.ndarray, l2: float) -> float:
        """The fraction of `labels` that the argmax of `scores` matches."""
        return float(np.mean(self.scores(features, l2).argmax(axis=1) == np.asarray(labels)))


def fit_least_squares(features: np.ndarray, labels: np.ndarray, num_classes: int) -> LeastSquares:
    """Prepare the regularised least-squares fit of `(num_points, dim)` features to the {-1, 1} one-hot
    codes of `labels` (ints in [0, num_classes)); `LeastSquares.weights(l2)` then solves it for any l2."""
    x = np.asarray(features, dtype=np.float64)  # float64: the Gram matrix of 25 x 1000 points stays exact
    mean = x.mean(axis=0, keepdims=True)
    std = x.std(axis=0, keepdims=True) + 1e-5
    x = np.pad((x - mean) / std, ((0, 0), (0, 1)), constant_values=BIAS_CONSTANT)
    y = 2.0 * np.eye(num_classes)[np.asarray(labels)] - 1.0  # (num_points, num_classes) in {-1, 1}
    if x.shape[0] >= x.shape[1]:
        eigs, q = np.linalg.eigh(x.T @ x)
        lhs, rhs = q, q.T @ (x.T @ y)
    else:  # fewer points than dimensions: the dual, an eigendecomposition of the small x x^T
        eigs, q = np.linalg.eigh(x @ x.T)
        lhs, rhs = x.T @ q, q.T @ y
    return LeastSquares(
        mean, std, np.clip(eigs, 0.0, None), lhs, rhs
    )  # clip: -1e-12 rounding of a PSD matrix


def select_l2(
    fit: LeastSquares, features: np.ndarray, labels: np.ndarray, grid: Sequence[float] = L2_GRID
) -> tuple[float, float]:
    """The l2 of `grid` with the best accuracy on the held-out `features`/`labels`, and that accuracy; ties
    go to the strongest regularisation (the safer fit when a small held-out set cannot tell them apart)."""
    best = (-1.0, 0.0)
    for l2 in sorted(grid, reverse=True):
        accuracy = fit.accuracy(features, labels, l2)
        if accuracy > best[0]:
            best = (accuracy, l2)
    return best[1], best[0]


# ---- which training images: k per class, and a held-out part for choosing l2 -----------------------------


@dataclass
class FewShotDraw:
    """One seed's choice of training rows: the held-out rows (for choosing l2) and, for each k, the k-shot
    rows; the k-shot sets are nested (the 5 images of a class include its 1) and disjoint from the held-out."""

    seed: int
    holdout: np.ndarray  # (num_holdout,) row indices into the training split
    shots: dict[int, np.ndarray]  # k -> (k * num_classes,) row indices


def holdout_count(class_size: int, fraction: float, max_per_class: int) -> int:
    """How many of a class's training images are held out: `fraction` of them, at least 1, at most
    `max_per_class` (enough to choose l2; more would only cost feature extraction on large datasets)."""
    return max(1, min(max_per_class, round(fraction * class_size)))


def draw_fewshot(
    labels: np.ndarray,
    num_classes: int,
    shots: Sequence[int],
    seed: int,
    holdout_fraction: float = 0.2,
    max_holdout_per_class: int = 50,
    excluded: Sequence[int] | np.ndarray = (),
    names: Sequence[str] | None = None,
) -> FewShotDraw:
    """For each class, a seeded permutation of its training rows (`labels`: the class of each row): the first
    `holdout_count` rows are held out, the next k are the k-shot images. `excluded` rows (images that do not
    decode) are skipped without changing which other rows a seed picks. A class with too few images for the
    largest k is a ValueError naming it and the largest k that fits."""
    labels = np.asarray(labels)
    excluded = np.asarray(sorted(set(int(i) for i in excluded)), dtype=np.int64)
    rng = np.random.default_rng(seed)
    holdout, pools = [], []
    for c in range(num_classes):
        order = rng.permutation(np.flatnonzero(labels == c))  # drawn before exclusions: stable picks
        order = order[~np.isin(order, excluded)]
        held = holdout_count(len(order), holdout_fraction, max_holdout_per_class)
        holdout.append(order[:held])
        pools.append(order[held:])
    largest = max(shots)
    sizes = [len(pool) for pool in pools]
    if min(sizes) < largest:
        c = int(np.argmin(sizes))
        name = names[c] if names is not None else str(c)
        raise ValueError(
            f"--shots {largest} needs {largest} training images per class, but class {name!r} has "
            f"{sizes[c]} once {len(holdout[c])} are held out for choosing the regularisation; pass --shots "
            f"values up to {sizes[c]}, or a smaller --holdout_fraction."
        )
    return FewShotDraw(
        seed=seed,
        holdout=np.concatenate(holdout),
        shots={k: np.concatenate([pool[:k] for pool in pools]) for k in shots},
    )


# ---- data and features ----------------------------------------------------------------------------------


@dataclass
class FewShotData:
    """The training and test splits: image values ({"bytes", "path"}), class ids, and the class names."""

    train_images: Sequence[Any]
    train_labels: np.ndarray  # (num_train,) int64
    test_images: Sequence[Any]
    test_labels: np.ndarray  # (num_test,) int64
    names: list[str]
    description: str


def load_fewshot_data(
    dataset: str | os.PathLike,
    dataset_config: str | None = None,
    train_split: str = "train",
    test_split: str = "test",
    image_column: str = "image",
    label_column: str = "label",
) -> FewShotData:
    """The train and test splits of `dataset`: a folder with train/ and test/ image folders
    (`<split>/<class name>/<image>`), a `save_to_disk` folder, or a Hub dataset id (splits by name), loaded
    with `vit_ft.data.datasets.load_image_datasets` (test labels encoded by the training split's class names)."""
    import datasets

    from ..data.datasets import load_image_datasets

    root = Path(dataset).expanduser()
    saved = (root / "dataset_dict.json").is_file() or (root / "state.json").is_file()
    if root.is_dir() and not saved:
        missing = [split for split in ("train", "test") if not (root / split).is_dir()]
        if missing:
            raise FileNotFoundError(
                f"--dataset {dataset} has no {' or '.join(s + '/' for s in missing)} folder; few-shot evaluation "
                f"samples from {dataset}/train/<class name>/<image> and scores on {dataset}/test/<class name>/"
                "<image>: add the missing split."
            )
        splits, names = load_image_datasets(
            train_dir=root / "train", test_dir=root / "test", validation_split_percentage=0
        )
        description = f"image folders {os.fspath(dataset)}/{{train,test}}"
    elif not root.exists() and looks_like_path(dataset):
        raise FileNotFoundError(
            f"--dataset {dataset}: no such folder; pass a folder with train/ and test/ image folders, a "
            "save_to_disk folder, or a Hub dataset id."
        )
    else:
        try:
            splits, names = load_image_datasets(
                dataset_name=os.fspath(dataset),
                dataset_config=dataset_config,
                train_split=train_split,
                validation_split=None,
                test_split=test_split,
                image_column=image_column,
                label_column=label_column,
                validation_split_percentage=0,
            )
        except ConnectionError as error:  # huggingface_hub's offline mode is one too
            raise ConnectionError(
                f"--dataset {dataset} is no folder here and the Hub could not be reached "
                f"({' '.join(str(error).split())}); a Hub dataset needs the network: connect, or pass a folder "
                "with train/ and test/ image folders."
            ) from error
        description = f"dataset {os.fspath(dataset)} (splits {train_split!r} and {test_split!r})"
    undecoded = {
        split: splits[split].cast_column("image", datasets.Image(decode=False)) for split in ("train", "test")
    }
    return FewShotData(
        train_images=undecoded["train"]["image"],
        train_labels=np.asarray(splits["train"]["label"], dtype=np.int64),
        test_images=undecoded["test"]["image"],
        test_labels=np.asarray(splits["test"]["label"], dtype=np.int64),
        names=list(names),
        description=description,
    )


def pre_logits(model: torch.nn.Module, pixel_values: torch.Tensor) -> torch.Tensor:
    """`(batch, channels, height, width)` -> the pooled `(batch, hidden)` features the classifier head sees."""
    backbone = getattr(model, "vit", model)  # ViTFTForImageClassification.vit is the encoder with its pooling
    return backbone(pixel_values=pixel_values).pooler_output


def extract_features(
    classifier: Classifier,
    images: Sequence[Any],
    batch_size: int = 64,
    num_workers: int = 0,
    bf16: bool = False,
    desc: str = "Features",
    progress: bool | None = None,
) -> tuple[np.ndarray, dict[int, str]]:
    """Frozen pre-logit features of `images` through the one inference loop (`iter_batches`):
    `(num_images, hidden)` float32 (zero rows for images that do not decode) and {index: why} for those."""
    device = classifier.device

    @torch.inference_mode()
    def forward(pixels: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            return pre_logits(classifier.model, pixels.to(device)).float().cpu()

    features: np.ndarray | None = None
    errors: dict[int, str] = {}
    for batch in iter_batches(classifier, images, batch_size, num_workers, desc, progress, forward):
        for offset, error in batch.errors.items():
            errors[batch.start + offset] = describe_error(error)
        if batch.outputs is None:
            continue
        if features is None:
            features = np.zeros((len(images), batch.outputs.shape[1]), dtype=np.float32)
        features[[batch.start + i for i in batch.decoded]] = batch.outputs.numpy()
    if features is None:
        raise ValueError(f"None of the {len(images)} images decodes, e.g. {describe_source(images[0])}.")
    return features, errors


# ---- the evaluation ------------------------------------------------------------------------------------


@dataclass
class ShotResult:
    """One k: test accuracy, chosen l2 and its held-out accuracy for each seed."""

    shots: int
    accuracies: list[float] = field(default_factory=list)
    l2: list[float] = field(default_factory=list)
    holdout_accuracies: list[float] = field(default_factory=list)

    @property
    def mean(self) -> float:
        return float(np.mean(self.accuracies))

    @property
    def std(self) -> float:
        """Sample standard deviation over seeds (ddof=1); 0 for a single seed."""
        return float(np.std(self.accuracies, ddof=1)) if len(self.accuracies) > 1 else 0.0


def parse_shots(text: str | Sequence[int]) -> tuple[int, ...]:
    """ "1,5,10,25" (or a sequence of ints) -> (1, 5, 10, 25), sorted and unique; anything else a ValueError."""
    parts = [p.strip() for p in text.split(",")] if isinstance(text, str) else [str(v) for v in text]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise ValueError(
            f"--shots {text if isinstance(text, str) else ','.join(parts)} must be a comma list of positive "
            "numbers of images per class, e.g. --shots 1,5,10,25."
        )
    return tuple(sorted(set(values)))


def parse_l2(text: str | Sequence[float]) -> tuple[float, ...]:
    """ "0.1,1,10" (or a sequence of numbers) -> (0.1, 1.0, 10.0); anything but positive finite numbers is a
    ValueError."""
    parts = [p.strip() for p in text.split(",")] if isinstance(text, str) else [str(v) for v in text]
    try:
        values = tuple(float(p) for p in parts)
    except ValueError:
        values = ()
    if not values or min(values) <= 0 or not all(math.isfinite(v) for v in values):
        raise ValueError(
            f"--l2 {','.join(parts)} must be a comma list of positive regularisation strengths, e.g. --l2 1024 "
            "(one value: no selection) or --l2 0.1,1,10,100."
        )
    return values


def check_settings(
    shots: Sequence[int], seeds: int, holdout_fraction: float, max_holdout_per_class: int
) -> None:
    """Refuse meaningless settings before any model or data loads."""
    if seeds < 1:
        raise ValueError(
            f"--seeds {seeds} must be at least 1 (the number of random draws of the k-shot images)."
        )
    if not 0 < holdout_fraction < 1:
        raise ValueError(
            f"--holdout_fraction {holdout_fraction} must be between 0 and 1 (the part of each class held out "
            "for choosing the regularisation), e.g. 0.2."
        )
    if max_holdout_per_class < 1:
        raise ValueError(f"--max_holdout_per_class {max_holdout_per_class} must be at least 1.")


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def check_output_dir(output_dir: str | os.PathLike, inputs: Sequence[str | os.PathLike]) -> Path:
    """Refuse an output folder that is (or is inside) an input folder: the model's folder or the dataset's
    (a fewshot.png inside a class folder would become a training image)."""
    out = Path(output_dir).expanduser().resolve()
    for value in inputs:
        folder = Path(value).expanduser()
        if folder.is_dir() and _inside(out, folder.resolve()):
            raise ValueError(
                f"--output_dir {output_dir} is inside the input folder {value}; pass a folder outside it, "
                "e.g. reports/fewshot."
            )
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(
            f"--output_dir {output_dir} is a file; pass a folder for {', '.join(OUTPUT_FILES)}."
        )
    return out


def _train_features(
    classifier: Classifier,
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
    """For each k and draw: fit on the k-shot rows, choose l2 on the held-out rows, score on the test set."""
    results = {k: ShotResult(k) for k in sorted(draws[0].shots)}
    for draw in draws:
        for k, rows in draw.shots.items():
            fit = fit_least_squares(train_features[rows], train_labels[rows], num_classes)
            l2, held = select_l2(fit, train_features[draw.holdout], train_labels[draw.holdout], l2_grid)
            results[k].accuracies.append(fit.accuracy(test_features, test_labels, l2))
            results[k].l2.append(l2)
            results[k].holdout_accuracies.append(held)
    return list(results.values())


def random_init_model(config: Any, seed: int = 0) -> torch.nn.Module:
    """A model of `config`'s size and shape with freshly initialised weights (the baseline pre-training is
    judged against), seeded."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return ViTFTForImageClassification(config).eval()


def run_fewshot(
    model: str | os.PathLike,
    dataset: str | os.PathLike,
    output_dir: str | os.PathLike,
    shots: str | Sequence[int] = DEFAULT_SHOTS,
    seeds: int = 3,
    dataset_config: str | None = None,
    train_split: str = "train",
    test_split: str = "test",
    image_column: str = "image",
    label_column: str = "label",
    holdout_fraction: float = 0.2,
    max_holdout_per_class: int = 50,
    l2: str | Sequence[float] | None = None,
    random_init: bool = False,
    image_size: int | Sequence[int] | None = None,
    max_tokens: int | None = MAX_IMAGE_TOKENS,
    batch_size: int = 64,
    device: str | None = None,
    bf16: str = "auto",
    num_workers: int = 0,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Few-shot linear accuracy of `model`'s frozen features on `dataset` for each k in `shots`, over seeds
    0 .. seeds-1; writes fewshot.md, fewshot.json and fewshot.png to `output_dir` and returns the JSON record.

    `random_init` replaces the weights with a fresh seeded initialisation of the same architecture (the
    baseline); `l2` is the regularisation grid (None: `L2_GRID`; one value: no selection); `max_tokens`
    bounds the patch tokens per image at `image_size`; `bf16` is "auto" (see `inference.use_bf16`), "true" or
    "false". Everything is checked before any image decodes, and nothing is written until the end.
    """
    shots = parse_shots(shots)
    l2_grid = L2_GRID if l2 is None else parse_l2(l2)
    check_settings(shots, seeds, holdout_fraction, max_holdout_per_class)
    if not isinstance(bf16, bool) and bf16 not in BF16_CHOICES:
        raise ValueError(f"--bf16 {bf16} must be one of {', '.join(BF16_CHOICES)}.")
    out = check_output_dir(output_dir, [model, dataset])

    classifier = load_classifier(model, image_size, device, max_tokens=max_tokens, require_head=False)
    if random_init:
        classifier.model = random_init_model(classifier.model.config).to(classifier.device)
    bf16 = use_bf16(bf16, classifier.device)
    data = load_fewshot_data(dataset, dataset_config, train_split, test_split, image_column, label_column)
    num_classes = len(data.names)

    def draws(excluded: np.ndarray) -> list[FewShotDraw]:
        return [
            draw_fewshot(
                data.train_labels,
                num_classes,
                shots,
                seed,
                holdout_fraction,
                max_holdout_per_class,
                excluded,
                data.names,
            )
            for seed in range(seeds)
        ]

    draws(np.zeros(0, dtype=np.int64))  # a class too small for the largest k fails before any image decodes

    def extract(images: Sequence[Any], desc: str) -> tuple[np.ndarray, dict[int, str]]:
        return extract_features(classifier, images, batch_size, num_workers, bf16, desc, progress)

    logger.info(
        "Few-shot evaluation of %s%s on %s: %d classes, shots %s, %d seed(s), bf16 %s.",
        model,
        " (randomly initialised)" if random_init else "",
        data.description,
        num_classes,
        ",".join(map(str, shots)),
        seeds,
        "on" if bf16 else "off",
    )
    started = time.perf_counter()
    train_features, drawn, skipped = _train_features(classifier, data, draws, extract)
    test_features, test_errors = extract(data.test_images, "Test features")
    seconds = time.perf_counter() - started
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

    results = evaluate_fewshot(
        train_features,
        data.train_labels,
        test_features[kept],
        data.test_labels[kept],
        num_classes,
        drawn,
        l2_grid,
    )
    record = {
        "model": os.fspath(model),
        "random_init": random_init,
        "dataset": data.description,
        "num_classes": num_classes,
        "num_test_images": int(kept.sum()),
        "num_train_images": len(data.train_labels),
        "feature_dim": int(train_features.shape[1]),
        "image_size": list(classifier.preprocessing.image_size),
        "bf16": bf16,
        "device": str(classifier.device),
        "seeds": seeds,
        "holdout_fraction": holdout_fraction,
        "max_holdout_per_class": max_holdout_per_class,
        "holdout_images": int(len(drawn[0].holdout)),
        "l2_grid": list(l2_grid),
        "feature_seconds": round(seconds, 2),
        "results": [
            {
                "shots": r.shots,
                "mean_accuracy": r.mean,
                "std_accuracy": r.std,
                "accuracies": r.accuracies,
                "l2": r.l2,
                "holdout_accuracies": r.holdout_accuracies,
            }
            for r in results
        ],
        "skipped": skipped,
    }
    write_outputs(out, record, results)
    return record


# ---- what people read ------------------------------------------------------------------------------------


def results_table(results: Sequence[ShotResult]) -> str:
    """The Markdown table: one row per k with mean ± std test accuracy (%) over seeds and each seed's value."""
    lines = [
        "| shots per class | accuracy (mean ± std over seeds) | per seed | chosen l2 |",
        "| --- | --- | --- | --- |",
    ]
    for r in results:
        per_seed = ", ".join(f"{100 * a:.1f}" for a in r.accuracies)
        l2s = ", ".join(f"2^{math.log2(v):g}" for v in r.l2)
        lines.append(f"| {r.shots} | {100 * r.mean:.1f} % ± {100 * r.std:.1f} | {per_seed} | {l2s} |")
    return "\n".join(lines) + "\n"


def _markdown(record: dict[str, Any], results: Sequence[ShotResult]) -> str:
    what = record["model"] + (" (randomly initialised weights)" if record["random_init"] else "")
    height, width = record["image_size"]
    setup = (
        f"Data: {record['dataset']}, {record['num_classes']} classes, {record['num_test_images']} test images. "
        f"Frozen pre-logit features ({record['feature_dim']} dimensions, {height}x{width} px, bf16 "
        f"{'on' if record['bf16'] else 'off'}); regularised least squares to {{-1, 1}}^K targets on k images per "
        f"class, the regularisation chosen on {record['holdout_images']} held-out training images; "
        f"{record['seeds']} seed(s)."
    )
    text = f"# Few-shot linear evaluation: {what}\n\n{setup}\n\n{results_table(results)}"
    if record["skipped"]:
        text += f"\n{len(record['skipped'])} images did not decode (listed in fewshot.json).\n"
    return text


def plot_fewshot(results: Sequence[ShotResult], path: str | os.PathLike, title: str) -> Path:
    """Test accuracy against shots per class (log axis), mean with ± std error bars, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display on servers
    import matplotlib.pyplot as plt

    shots = [r.shots for r in results]
    fig, ax = plt.subplots(figsize=(5.5, 4))
    ax.errorbar(
        shots, [100 * r.mean for r in results], yerr=[100 * r.std for r in results], marker="o", capsize=4
    )
    ax.set_xscale("log")
    ax.set_xticks(shots, [str(k) for k in shots])
    ax.minorticks_off()
    ax.set_xlabel("training images per class")
    ax.set_ylabel("test accuracy (%)")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_outputs(output_dir: Path, record: dict[str, Any], results: Sequence[ShotResult]) -> None:
    """fewshot.md, fewshot.json and fewshot.png, each written to a temporary file and renamed into place, so
    an interrupted run leaves the previous files whole."""
    output_dir.mkdir(parents=True, exist_ok=True)
    staged: list[tuple[str, Path]] = []
    try:
        for name in OUTPUT_FILES:
            handle, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=Path(name).suffix, dir=output_dir)
            os.close(handle)
            staged.append((name, Path(temporary)))
        texts = {
            "fewshot.md": _markdown(record, results),
            "fewshot.json": json.dumps(record, indent=2) + "\n",
        }
        for name, temporary in staged:
            if name in texts:
                temporary.write_text(texts[name], encoding="utf-8")
        title = f"Few-shot linear accuracy: {record['model']}" + (
            " (random init)" if record["random_init"] else ""
        )
        plot_fewshot(results, dict(staged)["fewshot.png"], title)
        for name, temporary in staged:
            move_into_place(temporary, output_dir / name)
    finally:
        for _, temporary in staged:
            temporary.unlink(missing_ok=True)


__all__ = [
    "DEFAULT_SHOTS",
    "L2_GRID",
    "FewShotData",
    "FewShotDraw",
    "LeastSquares",
    "ShotResult",
    "check_output_dir",
    "draw_fewshot",
    "evaluate_fewshot",
    "extract_features",
    "fit_least_squares",
    "load_fewshot_data",
    "parse_l2",
    "parse_shots",
    "pre_logits",
    "random_init_model",
    "results_table",
    "run_fewshot",
    "select_l2",
]
