"""CPU kernels for the ViT's products, each a drop-in for the plain torch call it replaces.

The model calls one function per product (`Linear`, `linear_activation`, `sdpa_attention_forward`) and LoRA's
input dropout is `PackedBitsDropout`; each decides here, in one place, whether its oneDNN path applies and
otherwise runs the plain torch computation. Results match the plain path to float32 rounding (bf16 rounding
under bf16 autocast); `tests/test_kernels.py` pins forward and backward to it.

Where the fast paths run (measured in BENCHMARKS.md "Where the CPU kernels run"):
- only on CPU tensors, never on CUDA or MPS, and never while torch.compile traces (it emits its own kernels);
- by default only on AMD x86 CPUs, where MKL's fp32 GEMM runs AVX2 code at about half oneDNN's AVX-512
  speed and torch's flash attention leaves the bf16 units idle; on Intel and ARM they were not measured to
  help, so the plain path runs.

The switch: environment variable `VIT_FT_KERNELS` = `auto` (the default, as above), `1` (wherever oneDNN is
available) or `0` (never). It is read at each call, so it can be flipped in a running process.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import threading

import torch
import torch.nn.functional as F
from torch import nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward as _torch_sdpa_attention_forward

KERNELS_ENV = "VIT_FT_KERNELS"

try:  # oneDNN's linear, the kernel torch.compile emits for CPU linears; absent from builds without oneDNN
    _onednn_linear = torch.ops.mkldnn._linear_pointwise
except (AttributeError, RuntimeError):
    _onednn_linear = None


@functools.cache
def cpuinfo(field: str) -> str:
    """A field of the first processor in /proc/cpuinfo ("vendor_id", "model name"); "" where there is none."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.split(":", 1)[0].strip() == field:
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _cpu_vendor() -> str:
    return cpuinfo("vendor_id")


def kernels_enabled() -> bool:
    """Whether the oneDNN paths may run at all: not tracing, the `VIT_FT_KERNELS` switch, oneDNN on."""
    # torch.compile and torch.export trace the plain path: they emit their own kernels, portable graphs. Checked
    # first, so that a trace never reads the environment or /proc/cpuinfo (each read would break the graph).
    if torch.compiler.is_compiling() or torch.compiler.is_exporting():
        return False
    setting = os.environ.get(KERNELS_ENV, "auto").strip().lower()
    if setting in ("0", "false", "off", "no"):
        return False
    if setting not in ("1", "true", "on", "yes") and _cpu_vendor() != "AuthenticAMD":
        return False
    return torch.backends.mkldnn.enabled


# ---- linear layers ----------------------------------------------------------------------------------------


def _onednn_matmul(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, act: str = "none"):
    """`act(x @ weight.T + bias)` in one oneDNN call, for any `(..., in)` x and `(out, in)` weight (transposed
    views included); act is "none" or "gelu" (exact, erf)."""
    out = _onednn_linear(x.reshape(-1, x.shape[-1]), weight, bias, act, [], "none" if act == "gelu" else "")
    return out.view(*x.shape[:-1], weight.shape[0])  # (..., out)


class _OneDNNLinearFunction(torch.autograd.Function):
    """F.linear whose three products (forward, input gradient, weight gradient) all run in oneDNN."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        # keep x only for a weight gradient and the weight only for an input gradient: a frozen layer (LoRA)
        # then holds no activation, as F.linear's autograd does
        needs_x_grad, needs_weight_grad = ctx.needs_input_grad[:2]
        ctx.save_for_backward(x if needs_weight_grad else None, weight if needs_x_grad else None)
        ctx.has_bias = bias is not None
        return _onednn_matmul(x, weight, bias)

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

    oneDNN runs the product where it applies: fp32 forward and backward, and bf16 autocast for inference (the
    bias and GELU then applied inside the product instead of in extra passes over the output).
    """
    if _onednn_linear is not None and x.device.type == "cpu" and kernels_enabled():
        autocast = torch.is_autocast_enabled("cpu")
        if (
            autocast
            and torch.get_autocast_dtype("cpu") == torch.bfloat16
            and not _needs_autograd(x, weight, bias)
        ):
            bf16 = (t if t is None else t.to(torch.bfloat16) for t in (x, weight, bias))  # autocast's casts
            return _onednn_matmul(*bf16, act=activation or "none")
        if not autocast and x.dtype == weight.dtype == torch.float32:
            if _needs_autograd(x, weight, bias):
                out = _OneDNNLinearFunction.apply(x, weight, bias)
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


# ---- attention --------------------------------------------------------------------------------------------


@functools.cache
def _onednn_bf16_hardware() -> bool:
    """oneDNN is built in, has the fp32_precision switch, and this CPU has native bf16 products."""
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.backends.mkldnn, "matmul"):
        return False
    supported = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(supported is not None and supported())


# threads that never run torch code: tqdm's progress-bar monitor (started by the first bar, e.g. of
# from_pretrained) and TensorBoard's event-file writer (Trainer's TensorBoard callback)
_NON_COMPUTING_THREADS = ("TMonitor", "_AsyncWriterThread")


def _another_thread_may_compute() -> bool:
    """Whether a Python thread other than this one is alive that could run a matrix product (a Gradio worker,
    a user's thread pool); the known non-computing helper threads above do not count."""
    me = threading.current_thread()
    return any(t is not me and type(t).__name__ not in _NON_COMPUTING_THREADS for t in threading.enumerate())


@contextlib.contextmanager
def _bf16_products_of_fp32():
    """Let oneDNN run fp32 matrix products on its bf16 units inside the block (`fp32_precision = "bf16"`).

    Used only for fp32 operands that hold bf16 values (upcast exactly), where it rounds nothing: a bf16 x bf16
    product with fp32 sums and an fp32 result, which torch has no CPU call for. The switch is process-wide, so
    it is flipped only while no other Python thread could run a matrix product meanwhile, and always put back;
    otherwise the same products run as plain fp32 products of the same values.
    """
    flags = torch.backends.mkldnn.matmul
    if _another_thread_may_compute():
        yield
        return
    previous = flags.fp32_precision
    flags.fp32_precision = "bf16"
    try:
        yield
    finally:
        flags.fp32_precision = previous


# N x N work is done for this many bytes of fp32 scores at a time, so that the scores, probabilities and
# their gradients of one chunk stay in cache between the passes over them (ViT-B at 224: 27 heads at once).
_ATTENTION_CHUNK_BYTES = 4 << 20


def _chunks(batch_heads: int, seq_len: int) -> list[slice]:
    step = max(1, _ATTENTION_CHUNK_BYTES // (4 * seq_len * seq_len))
    return [slice(start, start + step) for start in range(0, batch_heads, step)]


def _attention_probs(query32: torch.Tensor, key32: torch.Tensor, scale: float | None) -> torch.Tensor:
    """softmax(query @ key^T [* scale]) in fp32, `(chunk, N, head_dim)` x2 -> `(chunk, N, N)`. scale is None
    when it is folded into query32 already."""
    scores = torch.matmul(query32, key32.transpose(-2, -1))  # (chunk, N, N)
    return torch.softmax(scores if scale is None else scores.mul_(scale), dim=-1)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """`(B, heads, N, head_dim)` -> a contiguous `(B * heads, N, head_dim)` (one copy of a strided view)."""
    return t.reshape(-1, *t.shape[-2:])


def _score_operands(
    query: torch.Tensor, key: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor, float | None]:
    """Contiguous fp32 `(B * heads, N, head_dim)` copies of query and key for the score product, each made in
    one pass from the strided bf16 view; the scale is folded into query where that is exact (a power of two,
    e.g. head_dim 64: the bf16 product is exact), else returned to apply to the scores."""
    query32, key32 = (torch.empty(t.shape, dtype=torch.float32) for t in (query, key))
    key32.copy_(key)
    if math.frexp(scale)[0] == 0.5:
        torch.mul(query, scale, out=query32)
        score_scale = None
    else:
        query32.copy_(query)
        score_scale = scale
    return _rows(query32), _rows(key32), score_scale


class _OneDNNBF16Attention(torch.autograd.Function):
    """softmax(q k^T * scale) v for bf16 `(B, heads, N, head_dim)` on CPU, as batched oneDNN products.

    The rounding of torch's CPU flash-attention kernel: scores, softmax and its gradient in fp32 (the
    products from bf16 operands with fp32 sums, see `_bf16_products_of_fp32`); probabilities and score
    gradients rounded to bf16 for the products with v, q and k. About half the flash kernel's time forward and
    backward at ViT's ~200-token sequences, where its small tiles leave the bf16 units idle. The N x N work
    runs a cache-sized chunk of heads at a time, and backward recomputes the probabilities: nothing of size
    N x N outlives a call, as with flash.
    """

    @staticmethod
    def forward(ctx, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float):
        ctx.scale = scale
        query32, key32, score_scale = _score_operands(query, key, scale)  # (B * heads, N, head_dim) fp32
        value_view, value = value, _rows(value)  # contiguous, else every product below copies the view
        out = torch.empty_like(value)
        with _bf16_products_of_fp32():
            for rows in _chunks(*value.shape[:2]):
                probs = _attention_probs(query32[rows], key32[rows], score_scale)  # (chunk, N, N) fp32
                torch.matmul(probs.to(value.dtype), value[rows], out=out[rows])
        # the inputs are strided views of the qkv projection: saved as they are, copied again in backward
        ctx.save_for_backward(query, key, value_view, out)
        return out.view(query.shape)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        query_view, key_view, value_view, out = ctx.saved_tensors
        scale = ctx.scale
        query32, key32, score_scale = _score_operands(query_view, key_view, scale)
        query, key, value, grad_out = (_rows(t) for t in (query_view, key_view, value_view, grad_output))
        grad_out32, value32 = grad_out.float(), value.float()
        # softmax backward: dS = P * (dP - rowsum(P * dP)), and rowsum(P * dP) = rowsum(dO * O) per query
        row = (grad_out32 * out.float()).sum(-1, keepdim=True)  # (B * heads, N, 1)
        grad_query, grad_key, grad_value = (torch.empty_like(t) for t in (query, key, value))
        with _bf16_products_of_fp32():
            for rows in _chunks(*query.shape[:2]):
                probs = _attention_probs(query32[rows], key32[rows], score_scale)  # (chunk, N, N) fp32
                torch.matmul(probs.to(value.dtype).transpose(-2, -1), grad_out[rows], out=grad_value[rows])
                grad_probs = torch.matmul(grad_out32[rows], value32[rows].transpose(-2, -1))  # fp32
                grad_probs.sub_(row[rows])
                if score_scale is not None:  # a scale that is not a power of two: applied before rounding
                    grad_probs.mul_(score_scale)
                grad_scores = torch.empty(grad_probs.shape, dtype=query.dtype)  # (chunk, N, N) bf16
                torch.mul(grad_probs, probs, out=grad_scores)  # rounds once, in the same pass
                torch.matmul(grad_scores, key[rows], out=grad_query[rows])
                torch.matmul(grad_scores.transpose(-2, -1), query[rows], out=grad_key[rows])
        if score_scale is None:  # a power of two: exact on the bf16 results
            grad_query.mul_(scale)
            grad_key.mul_(scale)
        shape = grad_output.shape
        return grad_query.view(shape), grad_key.view(shape), grad_value.view(shape), None


def _onednn_attention_applies(query: torch.Tensor, attention_mask, dropout: float) -> bool:
    return (
        query.dtype == torch.bfloat16
        and query.device.type == "cpu"
        and attention_mask is None
        and dropout == 0.0
        and kernels_enabled()
        and _onednn_bf16_hardware()
    )


def sdpa_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers' "sdpa" attention function (same signature and output `(B, N, heads, head_dim)`), with
    bf16 on CPU as `_OneDNNBF16Attention`."""
    if _onednn_attention_applies(query, attention_mask, dropout):
        scale = query.shape[-1] ** -0.5 if scaling is None else scaling
        return _OneDNNBF16Attention.apply(query, key, value, scale).transpose(1, 2).contiguous(), None
    return _torch_sdpa_attention_forward(
        module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
    )


# ---- LoRA's input dropout ---------------------------------------------------------------------------------


class PackedBitsDropout(nn.Dropout):
    """nn.Dropout whose CPU mask costs a quarter of the random draws: 16 random bits decide each element, four
    elements per 64-bit draw. torch's CPU dropout draws one random number per element (~4 ns each here), which
    made LoRA's input dropout about 7% of a ViT-B training step.

    Drops with probability round(p * 65536) / 65536 (within 1e-5 of p) and scales what it keeps by the exact
    inverse of the keep probability, so the expectation is unchanged. Draws from torch's global generator:
    seeded runs repeat. Other devices, and the kernels switched off, use nn.Dropout's own kernel.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        drop_count = round(self.p * 65536)  # of the 65536 values of 16 bits, these many drop
        if not self.training or x.device.type != "cpu" or not 0 < drop_count < 65536 or not kernels_enabled():
            return super().forward(x)
        words = torch.empty((x.numel() + 3) // 4, dtype=torch.int64)
        words.random_(torch.iinfo(torch.int64).min, None)  # all 64 bits random
        bits = words.view(torch.int16)[: x.numel()].view(x.shape)  # uniform over [-32768, 32767]
        keep = bits >= drop_count - 32768
        return x * keep.to(x.dtype).mul_(65536 / (65536 - drop_count))


__all__ = [
    "KERNELS_ENV",
    "Linear",
    "PackedBitsDropout",
    "cpuinfo",
    "kernels_enabled",
    "linear",
    "linear_activation",
    "sdpa_attention_forward",
]
