"""The "profile" section: where our model's inference time goes, per kind of operation, from torch.profiler's
self times over a few calls. It accounts for the ceiling row: the matrix products' share is what the ceiling
measures; the rest (activations, normalisation, softmax, casts, copies) is what keeps the model below it."""

from __future__ import annotations

import logging

import torch
from torch.profiler import ProfilerActivity, profile

from vit_ft.model.modeling_vit_ft import ViTFTForImageClassification

from .common import DTYPES, BenchmarkSettings, Row
from .workloads import infer, random_batch

logger = logging.getLogger(__name__)

# (kind, substrings of aten / mkldnn operator names), first match wins; the rest is "other"
KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("matrix products", ("mm", "matmul", "linear", "conv")),  # mm: also addmm, bmm, baddbmm
    ("attention (fused kernel, softmax)", ("scaled_dot_product", "flash_attention", "softmax")),
    ("GELU", ("gelu",)),
    ("LayerNorm", ("layer_norm",)),
    ("casts and copies", ("_to_copy", "aten::to", "copy_", "contiguous", "clone")),
    ("element-wise (residual adds, scaling)", ("add", "mul", "div", "sub")),
)


def classify(op_name: str) -> str:
    name = op_name.lower()
    for kind, patterns in KINDS:
        if any(pattern in name for pattern in patterns):
            return kind
    return "other"


def time_by_kind(model: torch.nn.Module, pixels: torch.Tensor, dtype: torch.dtype | None, calls: int) -> dict:
    """Milliseconds of self CPU time per call, per kind of operation (every operator's own time, children
    excluded, so the kinds add up to the profiled total)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            infer(model, pixels, dtype)
    totals: dict[str, float] = {}
    for event in prof.key_averages():
        kind = classify(event.key)
        totals[kind] = totals.get(kind, 0.0) + event.self_cpu_time_total / 1000 / calls
    return totals


def bench_profile(settings: BenchmarkSettings, ours: ViTFTForImageClassification) -> list[Row]:
    """One row per kind and dtype: its milliseconds per inference call against the whole call's."""
    rows: list[Row] = []
    batch = settings.infer_batch_size
    pixels, _ = random_batch(ours.config, batch, settings.seed)
    for dtype_name in settings.dtypes:
        dtype = DTYPES[dtype_name]
        for _ in range(settings.warmup):
            infer(ours, pixels, dtype)
        logger.info("profile, inference, %s", dtype_name)
        totals = time_by_kind(ours, pixels, dtype, calls=max(settings.rounds, 1))
        whole = sum(totals.values())
        measurement = (
            f"inference, {dtype_name}, {ours.config.image_hw[0]} px, batch {batch}: self CPU time per call by "
            "kind of operation (torch.profiler)"
        )
        for kind, milliseconds in sorted(totals.items(), key=lambda item: -item[1]):
            rows.append(
                Row(
                    section="profile",
                    measurement=measurement,
                    unit="ms",
                    candidate=f"vit_ft, {kind}",
                    candidate_value=milliseconds,
                    reference="the whole call",
                    reference_value=whole,
                    ratio=milliseconds / whole,
                )
            )
    return rows
