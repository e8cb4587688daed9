"""bf16 attention on CPU as batched oneDNN products, behind transformers' "sdpa" attention signature.

`sdpa_attention_forward` takes the oneDNN path for bf16 CPU tensors without mask or dropout where the switch
(`switch.kernels_enabled`) allows it and the CPU has native bf16 products (`utils.hardware.onednn_bf16_supported`,
asked at each call); everything else goes to transformers' own SDPA function.
"""

from __future__ import annotations

import contextlib
import math
import threading

import torch
from torch import nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward as _torch_sdpa_attention_forward

from ..utils import hardware
from .switch import kernels_enabled


def _onednn_bf16_hardware() -> bool:
    """This torch's oneDNN has the fp32_precision switch, and this CPU has native bf16 products (the one answer,
    `utils.hardware.onednn_bf16_supported`)."""
    return hasattr(torch.backends.mkldnn, "matmul") and hardware.onednn_bf16_supported()


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


__all__ = ["sdpa_attention_forward"]
