"""FLOPs of one forward pass: analytic, by matrix product, and as torch's FlopCounterMode counts them."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.utils import flop_counter

from vit_ft.model.configuration_vit_ft import ViTFTConfig


@dataclass(frozen=True)
class Gemm:
    """`count` matrix products (batch, m, k) x (batch, k, n) of one forward pass."""

    name: str
    batch: int
    m: int
    k: int
    n: int
    count: int

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.k * self.n * self.count  # 2 FLOPs per multiply-add


def forward_gemms(config: ViTFTConfig, batch_size: int) -> list[Gemm]:
    """Every matrix product of one forward pass: patch embedding (a stride-p convolution is one GEMM), per layer
    qkv, attention scores, attention-weighted values, output projection and MLP, then the head."""
    grid_h, grid_w = config.grid_size
    patch_h, patch_w = config.patch_hw
    patches = grid_h * grid_w
    tokens = patches + 1  # CLS
    hidden, layers = config.hidden_size, config.num_hidden_layers
    heads = config.num_attention_heads
    rows = batch_size * tokens
    gemms = [
        Gemm("patch embedding", 1, batch_size * patches, config.num_channels * patch_h * patch_w, hidden, 1),
        Gemm("qkv", 1, rows, hidden, 3 * hidden, layers),
        Gemm("attention scores", batch_size * heads, tokens, hidden // heads, tokens, layers),
        Gemm("attention x values", batch_size * heads, tokens, tokens, hidden // heads, layers),
        Gemm("proj", 1, rows, hidden, hidden, layers),
        Gemm("fc1", 1, rows, hidden, config.intermediate_size, layers),
        Gemm("fc2", 1, rows, config.intermediate_size, hidden, layers),
    ]
    if config.num_labels > 0:
        gemms.append(Gemm("head", 1, batch_size, hidden, config.num_labels, 1))
    return gemms


def forward_flops(config: ViTFTConfig, batch_size: int) -> dict[str, int]:
    """Analytic FLOPs of one forward pass by part, and their "total". Matrix products only (2 per multiply-add):
    LayerNorm, softmax, GELU and bias adds are O(tokens x hidden) and left out, as is customary."""
    flops = {gemm.name: gemm.flops for gemm in forward_gemms(config, batch_size)}
    flops["total"] = sum(flops.values())
    return flops


def _linear_flop(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * math.prod(x_shape[:-1]) * w_shape[0] * w_shape[1]


def _cpu_sdpa_flop(q_shape, k_shape, v_shape, *args, out_shape=None, **kwargs) -> int:
    batch, heads, q_len, head_dim = q_shape
    return 2 * 2 * batch * heads * q_len * k_shape[-2] * head_dim  # scores, then weights x values


def count_flops(model: torch.nn.Module, pixel_values: torch.Tensor) -> int:
    """FLOPs of `model(pixel_values)` as `torch.utils.flop_counter.FlopCounterMode` counts them, taught the two
    CPU kernels it does not know: oneDNN's linear (vit_ft's float32 CPU path) and the CPU flash attention."""
    extra = {
        torch.ops.mkldnn._linear_pointwise: _linear_flop,
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flop,
    }
    for op, formula in extra.items():
        if op not in flop_counter.flop_registry:
            flop_counter.register_flop_formula(op)(formula)
    with torch.no_grad(), flop_counter.FlopCounterMode(display=False) as counter:
        model(pixel_values=pixel_values)
    return counter.get_total_flops()
