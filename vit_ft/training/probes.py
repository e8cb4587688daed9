"""`method: linear` and `method: knn`: the fine-tune's probes on the frozen backbone, fitted in place of training.

The pre-trained backbone stays as it is; its pooled features of the training images (through the evaluation
transform, as the feature bank reads them) fit the head, and the rest of the fine-tune (the final evaluation,
the task's fits on validation, the saved folder, the feature bank, the card) runs as after training:
- `linear`: a logistic regression (`tasks.probes.fit_linear_probe`, its C chosen by the validation split's log
  loss) written into the `classifier` layer: the saved folder is an ordinary `ViTFTForImageClassification`;
- `knn`: the classifier becomes the kNN head (`model.knn_head`, `head_type: knn` in the config) holding the
  features of a class-stratified sample of at most BANK_MAX_IMAGES training images and their labels as buffers:
  predict, evaluate and the ONNX export run it as any other model.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np
import torch
from transformers.trainer_utils import TrainOutput

from ..data.training_split import reads_whole
from ..model.knn_head import KNN_K, KNN_TEMPERATURE, make_head
from ..tasks.feature_bank import BANK_MAX_IMAGES, FrozenFeatures, bank_features, stratified_rows
from ..tasks.probes import PROBE_C, choose_probe_c, fit_linear_probe
from .inputs import model_input_spec

logger = logging.getLogger("vit_ft")

PROBE_METHODS = ("linear", "knn")


def fit_probe(trainer: Any, method: str, seed: int = 0) -> TrainOutput:
    """Fit `trainer.model`'s head by `method` ("linear" or "knn") on the frozen features of the training split;
    returns what `Trainer.train` would (no steps, the fit's time as `train_runtime`)."""
    if method not in PROBE_METHODS:
        raise ValueError(f"method={method!r} is not a probe; use one of {PROBE_METHODS}.")
    if not reads_whole(trainer.train_dataset):
        raise ValueError(f"method: {method} reads the training split whole; it cannot be streamed (streaming: false).")
    model = trainer.model
    if model.config.distillation_token:
        raise ValueError(f"method: {method} fits one head; a model with a distillation token has two: use method: full.")
    start = time.perf_counter()
    train = trainer.train_dataset.with_format(None)  # the stored images, not the training transform's crops
    labels = np.asarray(train["label"])  # (n,) class ids or (n, labels) multi-hot rows
    rows = stratified_rows(labels, BANK_MAX_IMAGES, seed) if method == "knn" else np.arange(len(labels))
    transform = model_input_spec(trainer.processing_class, model.config).eval_transform()
    logger.info("%s probe: frozen features of %d training images, one forward pass each (the feature bank reuses "
                "them).", method.capitalize(), len(rows))  # fmt: skip
    features, kept = bank_features(model, transform, train.select(rows)["image"], desc="Probe features")
    # the backbone stays as it is: the feature bank at the end reads these instead of a second pass
    trainer.frozen_features = {"train": FrozenFeatures(rows, features, kept)}
    pooled, labels = features["features"], labels[rows][kept]
    if not len(kept):
        raise ValueError(f"method: {method} found no training image that decodes; check the training data.")
    parameter = next(model.parameters())  # the backbone's device and dtype
    if method == "knn":
        model.config.head_type, model.config.knn_bank_size = "knn", len(kept)
        model.config.knn_k, model.config.knn_temperature = KNN_K, KNN_TEMPERATURE
        model.classifier = make_head(model.config, pooled.shape[1]).to(parameter.device)
        model.classifier.fill(torch.as_tensor(pooled).to(parameter.device), torch.as_tensor(labels).to(parameter.device))
    else:
        c = _validated_c(trainer, transform, pooled, labels)
        weight, bias = fit_linear_probe(pooled, labels, model.config.num_labels, c)
        with torch.no_grad():
            model.classifier.weight.copy_(torch.as_tensor(weight))  # copy_ casts to the head's dtype
            model.classifier.bias.copy_(torch.as_tensor(bias))
    seconds = time.perf_counter() - start
    logger.info("%s probe fitted on the frozen features of %d training images in %.1f s.",
                "kNN" if method == "knn" else "Linear", len(kept), seconds)  # fmt: skip
    metrics = {"train_runtime": round(seconds, 4), "train_samples": len(kept)}
    if method == "linear":
        metrics["probe_c"] = c
    return TrainOutput(0, 0.0, metrics)


def fit_lp_ft_head(trainer: Any, seed: int = 0) -> None:
    """LP-FT's first stage (Kumar et al. 2022, "Fine-Tuning can Distort Pretrained Features"): the linear probe
    fitted to convergence on the frozen features (`fit_probe`'s, C chosen on validation) and written into the head
    that full fine-tuning then starts from. Its features are dropped: fine-tuning moves the backbone, so the
    feature bank at the end reads the fine-tuned one."""
    logger.info("LP-FT: the linear probe first, then full fine-tuning from its head.")
    fit_probe(trainer, "linear", seed)
    del trainer.frozen_features


def _validated_c(trainer: Any, transform: Any, features: np.ndarray, labels: np.ndarray) -> float:
    """The linear probe's C, chosen by the validation split's log loss (`tasks.probes.choose_probe_c`); scikit-
    learn's default 1 where there is no validation split to choose on."""
    validation = trainer.eval_dataset
    if validation is None or not len(validation):
        logger.info("Linear probe: no validation split to choose C on; C = %g.", PROBE_C)
        return PROBE_C
    validation = validation.with_format(None)
    logger.info("Linear probe: frozen features of %d validation images, to choose C on.", len(validation))
    found, kept = bank_features(trainer.model, transform, validation["image"], desc="Probe features (validation)")
    trainer.frozen_features["validation"] = FrozenFeatures(np.arange(len(validation)), found, kept)
    if not len(kept):
        return PROBE_C
    val_labels = np.asarray(validation["label"])[kept]
    c, losses = choose_probe_c(features, labels, found["features"], val_labels, trainer.model.config.num_labels)
    logger.info("Linear probe: C = %g, the lowest validation log loss of %d images (%s).", c, len(kept),
                ", ".join(f"C {value:g}: {loss:.4f}" for value, loss in losses.items()))  # fmt: skip
    return c


__all__ = ["PROBE_METHODS", "fit_lp_ft_head", "fit_probe"]
