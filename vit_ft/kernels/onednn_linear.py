"""oneDNN linear layers: `F.linear` (optionally with an exact GELU fused in) whose products run in oneDNN on CPUs
where the switch (`switch.kernels_enabled`) allows it, and the plain torch call everywhere else. The bf16 products
run in oneDNN only where the CPU has native bf16 (`utils.hardware.onednn_bf16_supported`): elsewhere oneDNN has
no bf16 kernel (its "could not create a primitive descriptor") and torch's autocast emulates them.

Results match the plain path to float32 rounding (bf16 rounding under bf16 autocast); `tests/kernels` pins
forward and backward to it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..utils import hardware
from .switch import kernels_enabled

try:  # oneDNN's linear, the kernel torch.compile emits for CPU linears; absent from builds without oneDNN
    _onednn_linear = torch.ops.mkldnn._linear_pointwise
except (AttributeError, RuntimeError):
    _onednn_linear = None


def _onednn_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: str = "none"):
    """`act(x @ weight.T + bias)` in one oneDNN call, for any `(..., in)` x and `(out, in)` weight (transposed
    views included); act is "none" or "gelu" (exact, erf)."""
    out = _onednn_linear(x.reshape(-1, x.shape[-1]), weight, bias, act, [], "none" if act == "gelu" else "")
    return out if x.dim() == 2 else out.view(*x.shape[:-1], weight.shape[0])  # (..., out)


class _OneDNNLinearFunction(torch.autograd.Function):
    """F.linear whose three products (forward, input gradient, weight gradient) all run in oneDNN."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        # keep x only for a weight gradient and the weight only for an input gradient: a frozen layer (LoRA)
        # then holds no activation, as F.linear's autograd does
        needs_x_grad, needs_weight_grad = ctx.needs_input_grad[:2]
        ctx.save_for_backward(x if needs_weight_grad else None, weight if needs_x_grad else None)
        ctx.has_bias = bias is not None
        return _onednn_matmul(x, weight, bias)  # x is (rows, in): no view out, which an in-place add would refuse

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad_2d = grad_output.reshape(-1, grad_output.shape[-1])  # (rows, out)
        grad_x = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:
            grad_x = _onednn_matmul(grad_output, weight.t(), None)  # (..., in)
        if ctx.needs_input_grad[1]:
            grad_weight = _onednn_matmul(grad_2d.t(), x.reshape(-1, x.shape[-1]).t(), None)  # (out, in)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_bias = grad_2d.sum(0)
        return grad_x, grad_weight, grad_bias


def _needs_autograd(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, activation: str | None = None
) -> torch.Tensor:
    """`activation(F.linear(x, weight, bias))`: `(..., in)` -> `(..., out)`; activation None or "gelu" (exact).

    oneDNN runs the product where it applies: fp32 forward and backward, and bf16 autocast for inference on a CPU
    with native bf16 (the bias and GELU then applied inside the product instead of in extra passes over the output).
    """
    if _onednn_linear is not None and x.device.type == "cpu" and kernels_enabled():
        autocast = torch.is_autocast_enabled("cpu")
        if (
            autocast
            and torch.get_autocast_dtype("cpu") == torch.bfloat16
            and not _needs_autograd(x, weight, bias)
            and hardware.onednn_bf16_supported()
        ):
            bf16 = (t if t is None else t.to(torch.bfloat16) for t in (x, weight, bias))  # autocast's casts
            return _onednn_matmul(*bf16, act=activation or "none")
        if not autocast and x.dtype == weight.dtype == torch.float32:
            if _needs_autograd(x, weight, bias):
                # (rows, in) into the Function and the view outside it, so that an in-place add on the output (AdaLoRA's
                # `result +=`) is ordinary autograd; a custom Function's view output refuses it
                rows = _OneDNNLinearFunction.apply(x.reshape(-1, x.shape[-1]), weight, bias)
                out = rows.view(*x.shape[:-1], weight.shape[0])  # (..., out)
            else:
                return _onednn_matmul(x, weight, bias, act=activation or "none")
            return F.gelu(out) if activation == "gelu" else out
    out = F.linear(x, weight, bias)
    return F.gelu(out) if activation == "gelu" else out


class Linear(nn.Linear):
    """nn.Linear whose product is `linear` above: same parameters, state-dict keys and results. A subclass, so
    peft's LoRA and anything else that looks for an nn.Linear still finds one."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


def linear_activation(layer: nn.Module, x: torch.Tensor, act_name: str, act: nn.Module) -> torch.Tensor:
    """`act(layer(x))`, with an exact GELU fused into the product where `layer` is our own `Linear` (not a
    peft wrapper, whose adapter must see the call)."""
    if act_name == "gelu" and type(layer) is Linear:
        return linear(x, layer.weight, layer.bias, activation="gelu")
    return act(layer(x))


__all__ = ["Linear", "linear", "linear_activation"]
