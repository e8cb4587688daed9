"""The vit_ft Vision Transformer (arXiv 2010.11929) as a transformers PreTrainedModel.

Reads top to bottom: PatchEmbeddings -> Embeddings -> Attention -> MLP -> Layer -> PreTrainedModel ->
Model -> ForImageClassification. Loads transformers ViT checkpoints (ViTModel, ViTForImageClassification)
and our own folders through one `from_pretrained`, at any resolution that is a multiple of the patch size.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPooling, ImageClassifierOutput
from transformers.utils import cached_file

from .configuration_vit_ft import ViTFTConfig, to_2tuple
from .conversion import LoadingReport, adapt_state_dict, convert_hf_vit_state_dict, strip_prefix
from .pos_embed import resample_position_embeddings

logger = logging.getLogger(__name__)

# fields copied from a transformers ViTConfig; everything else there is either derived or unused here
VIT_CONFIG_FIELDS = (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act",
    "hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range", "layer_norm_eps",
    "image_size", "patch_size", "num_channels", "qkv_bias",
)  # fmt: skip
# keyword arguments of transformers' from_pretrained that locate files
HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder", "proxies")
# keyword arguments AutoModel / pipeline / peft pass along that do not apply to this loader
IGNORED_KWARGS = (
    "trust_remote_code", "_from_auto", "_from_pipeline", "code_revision", "adapter_kwargs", "use_safetensors",
    "low_cpu_mem_usage", "device_map", "attn_implementation", "user_agent", "_commit_hash",
)  # fmt: skip

try:  # oneDNN's linear, the kernel torch.compile emits for CPU linears; absent from builds without oneDNN
    _onednn_linear = torch.ops.mkldnn._linear_pointwise
except (AttributeError, RuntimeError):
    _onednn_linear = None


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
        ctx.x_shape = x.shape
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


class ViTFTLinear(nn.Linear):
    """nn.Linear whose CPU products run in oneDNN where F.linear would be slower; same parameters, state-dict
    keys and results (to float32 rounding, or to bf16 rounding for a fused GELU).

    - float32: F.linear calls MKL's GEMM, which on AMD CPUs runs AVX2 code at about half of oneDNN's AVX-512
      speed; here forward and backward products all run in oneDNN.
    - bf16 autocast, inference only: the bias (and with `forward_fused`, the MLP's GELU) is applied inside the
      product instead of in extra passes over the output. Training under autocast keeps F.linear, whose
      backward autocast knows.
    A subclass, so peft's LoRA and anything else that looks for an nn.Linear still finds one.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_fused(x, "none")

    def forward_fused(self, x: torch.Tensor, act: str) -> torch.Tensor:
        """`act(x @ weight.T + bias)`, act "none" or "gelu" (exact): `(..., in)` -> `(..., out)`."""
        args = self._onednn_args(x)
        if args is None or (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)):
            out = F.linear(x, self.weight, self.bias) if args is None else _OneDNNLinearFunction.apply(*args)
            return F.gelu(out) if act == "gelu" else out
        return _onednn_matmul(*args, act=act)

    def _onednn_args(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
        """(input, weight, bias) for oneDNN in float32 or under bf16 autocast; None where F.linear is right."""
        if (
            _onednn_linear is None
            or x.device.type != "cpu"
            or not torch.backends.mkldnn.enabled
            or torch.compiler.is_compiling()
        ):
            return None
        if torch.is_autocast_enabled("cpu"):
            if torch.is_grad_enabled() or torch.get_autocast_dtype("cpu") != torch.bfloat16:
                return None
            bias = None if self.bias is None else self.bias.to(torch.bfloat16)
            return x.to(torch.bfloat16), self.weight.to(torch.bfloat16), bias  # the casts autocast would make
        if x.dtype == self.weight.dtype == torch.float32:
            return x, self.weight, self.bias
        return None


@contextlib.contextmanager
def _bf16_products_of_fp32():
    """Let oneDNN run fp32 matrix products on its bf16 units inside the block (`fp32_precision = "bf16"`).

    Used only for fp32 operands that hold bf16 values (upcast exactly), where it rounds nothing: a bf16 x bf16
    product with fp32 sums and an fp32 result, which torch has no CPU call for; several times faster than
    the fp32 product.
    """
    flags = torch.backends.mkldnn.matmul
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
    """softmax(query @ key^T [* scale]) in fp32, `(chunk, N, head_dim)` x2 -> `(chunk, N, N)`; call inside
    `_bf16_products_of_fp32`. scale is None when it is folded into query32 already."""
    scores = torch.matmul(query32, key32.transpose(-2, -1))  # (chunk, N, N)
    return torch._softmax(scores if scale is None else scores.mul_(scale), -1, False)


def _onednn_bf16_attention_usable(query: torch.Tensor, dropout: float) -> bool:
    """Whether `_OneDNNBF16Attention` applies: bf16 on a CPU with oneDNN bf16 products, no attention dropout."""
    return (
        query.dtype == torch.bfloat16
        and query.device.type == "cpu"
        and dropout == 0.0
        and torch.backends.mkldnn.enabled
        and _onednn_bf16_hardware()
        and not torch.compiler.is_compiling()
    )


@functools.cache
def _onednn_bf16_hardware() -> bool:
    """oneDNN is built in, has the fp32_precision switch, and this CPU has native bf16 products."""
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.backends.mkldnn, "matmul"):
        return False
    supported = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(supported is not None and supported())


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


class ViTFTPatchEmbeddings(nn.Module):
    """`(batch, channels, height, width)` pixels -> `(batch, num_patches, hidden)` patch embeddings."""

    def __init__(self, config: ViTFTConfig):
        super().__init__()
        self.num_channels = config.num_channels
        self.patch_size = config.patch_hw
        self.projection = nn.Conv2d(
            config.num_channels, config.hidden_size, kernel_size=self.patch_size, stride=self.patch_size
        )

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        if pixel_values.shape[1] != self.num_channels:
            raise ValueError(
                f"pixel_values has {pixel_values.shape[1]} channels but the model expects {self.num_channels}: "
                "pass (batch, channels, height, width) images converted to RGB."
            )
        return self.projection(pixel_values).flatten(2).transpose(1, 2)  # (B, N, hidden)


class ViTFTEmbeddings(nn.Module):
    """CLS token + patch embeddings + learned position embeddings, resampled when the input size differs."""

    def __init__(self, config: ViTFTConfig):
        super().__init__()
        self.patch_size = config.patch_hw
        self.grid_size = config.grid_size
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.hidden_size))
        self.patch_embeddings = ViTFTPatchEmbeddings(config)
        num_positions = self.grid_size[0] * self.grid_size[1] + 1
        self.position_embeddings = nn.Parameter(torch.zeros(1, num_positions, config.hidden_size))
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def grid_for(self, height: int, width: int) -> tuple[int, int]:
        """The patch grid of an input of `height` x `width` pixels, or a ValueError saying what to fix."""
        ph, pw = self.patch_size
        if height % ph or width % pw or height <= 0 or width <= 0:
            raise ValueError(
                f"Input size {height}x{width} is not a multiple of the patch size {ph}x{pw}: resize or crop the "
                f"images to a multiple, e.g. {max(ph, round(height / ph) * ph)}x{max(pw, round(width / pw) * pw)}, "
                "or use the model's image processor."
            )
        return (height // ph, width // pw)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        batch_size, _, height, width = pixel_values.shape
        grid = self.grid_for(height, width)
        embeddings = self.patch_embeddings(pixel_values)  # (B, N, hidden)
        cls_tokens = self.cls_token.expand(batch_size, -1, -1)  # (B, 1, hidden)
        embeddings = torch.cat([cls_tokens, embeddings], dim=1)  # (B, 1 + N, hidden)
        position_embeddings = resample_position_embeddings(self.position_embeddings, self.grid_size, grid)
        return self.dropout(embeddings + position_embeddings)


class ViTFTAttention(nn.Module):
    """Multi-head self-attention with one fused qkv projection.

    `scaled_dot_product_attention` on the normal path (in bf16 on CPU, the same computation as batched oneDNN
    products: `_OneDNNBF16Attention`); an eager path that returns the attention maps when they are asked for
    (or when `config._attn_implementation == "eager"`).
    """

    def __init__(self, config: ViTFTConfig):
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.scaling = self.head_dim**-0.5
        self.dropout = config.attention_probs_dropout_prob
        self.qkv = ViTFTLinear(config.hidden_size, 3 * config.hidden_size, bias=config.qkv_bias)
        self.proj = ViTFTLinear(config.hidden_size, config.hidden_size)

    def forward(
        self, hidden_states: torch.Tensor, output_attentions: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch_size, seq_len, hidden = hidden_states.shape
        qkv = self.qkv(hidden_states).view(batch_size, seq_len, 3, self.num_heads, self.head_dim)
        # unbind before moving the heads forward: backward then stacks the gradients in qkv's own layout
        query, key, value = (t.transpose(1, 2) for t in qkv.unbind(2))  # each (B, heads, N, head_dim)
        dropout = self.dropout if self.training else 0.0
        attn_weights = None
        if output_attentions or self.config._attn_implementation == "eager":
            attn_weights = torch.matmul(query, key.transpose(-2, -1)) * self.scaling  # (B, heads, N, N)
            attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
            attn_output = torch.matmul(F.dropout(attn_weights, p=dropout, training=self.training), value)
        elif _onednn_bf16_attention_usable(query, dropout):
            attn_output = _OneDNNBF16Attention.apply(query, key, value, self.scaling)
        else:
            attn_output = F.scaled_dot_product_attention(
                query, key, value, dropout_p=dropout, scale=self.scaling
            )
        attn_output = attn_output.transpose(1, 2).reshape(batch_size, seq_len, hidden)  # (B, N, hidden)
        return self.proj(attn_output), attn_weights


class ViTFTMLP(nn.Module):
    def __init__(self, config: ViTFTConfig):
        super().__init__()
        self.fc1 = ViTFTLinear(config.hidden_size, config.intermediate_size)
        self.act = ACT2FN[config.hidden_act]
        self.fc2 = ViTFTLinear(config.intermediate_size, config.hidden_size)
        self.fuse_gelu = config.hidden_act == "gelu"  # exact GELU, which oneDNN can apply inside fc1

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.fuse_gelu and type(self.fc1) is ViTFTLinear:  # not when peft has wrapped fc1
            return self.fc2(self.fc1.forward_fused(hidden_states, "gelu"))
        return self.fc2(self.act(self.fc1(hidden_states)))


class ViTFTLayer(GradientCheckpointingLayer):
    """Pre-norm encoder block: x + Attn(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, config: ViTFTConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attention = ViTFTAttention(config)
        self.norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = ViTFTMLP(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self, hidden_states: torch.Tensor, output_attentions: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        attn_output, attn_weights = self.attention(
            self.norm1(hidden_states), output_attentions=output_attentions
        )
        hidden_states = hidden_states + self.dropout(attn_output)
        hidden_states = hidden_states + self.dropout(self.mlp(self.norm2(hidden_states)))
        return hidden_states, attn_weights


class ViTFTPreTrainedModel(PreTrainedModel):
    config_class = ViTFTConfig
    config: ViTFTConfig
    base_model_prefix = "vit"
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    supports_gradient_checkpointing = True
    _no_split_modules = ["ViTFTEmbeddings", "ViTFTLayer"]
    _supports_sdpa = True
    # our forward takes no loss kwargs: Trainer must scale the loss itself under accumulation / several processes
    accepts_loss_kwargs = False

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Truncated-normal weights, zero biases, unit LayerNorms, and a zero classifier head (paper §3.1)."""
        std = self.config.initializer_range
        if module is getattr(self, "classifier", None) and isinstance(module, nn.Linear):
            init.zeros_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, (nn.Linear, nn.Conv2d)):
            init.trunc_normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, ViTFTEmbeddings):
            init.trunc_normal_(module.position_embeddings, mean=0.0, std=std)
            init.trunc_normal_(module.cls_token, mean=0.0, std=std)

    def no_weight_decay(self) -> set[str]:
        """Parameter names that optimizers conventionally exclude from weight decay (timm's habit)."""
        prefix = "" if isinstance(self, ViTFTModel) else f"{self.base_model_prefix}."
        return {f"{prefix}embeddings.cls_token", f"{prefix}embeddings.position_embeddings"}

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | os.PathLike,
        *model_args: Any,
        config: ViTFTConfig | None = None,
        dtype: torch.dtype | str | None = None,
        output_loading_info: bool = False,
        **kwargs: Any,
    ):
        """Load a transformers ViT checkpoint or a vit_ft folder (Hub id or local path) at any resolution.

        Config fields passed as keyword arguments override the checkpoint's, e.g. `image_size=384,
        num_labels=120, id2label=...`. Position embeddings are resampled when `image_size` differs from the
        checkpoint's; a classifier head is kept when the label count matches and newly (zero) initialised
        otherwise. Every checkpoint tensor is accounted for; `model.loading_report` says what happened.
        """
        if model_args:
            raise TypeError(
                f"{cls.__name__}.from_pretrained takes no positional model arguments, got {model_args}."
            )
        for name in IGNORED_KWARGS:
            kwargs.pop(name, None)
        if kwargs.pop("torch_dtype", None) is not None and dtype is None:
            raise TypeError("Use dtype=..., not torch_dtype=....")
        hub_kwargs = {name: kwargs.pop(name) for name in HUB_KWARGS if name in kwargs}
        source = str(pretrained_model_name_or_path)
        config_path = cached_file(source, "config.json", **hub_kwargs)
        with open(config_path, encoding="utf-8") as f:
            source_dict = json.load(f)
        source_config, source_format = _source_config(source_dict, source)
        if config is None:
            config = _target_config(source_config, kwargs)
        elif kwargs:
            raise TypeError(
                f"Got both config= and config overrides {sorted(kwargs)}; put the overrides in the config."
            )

        state_dict = _read_safetensors(source, hub_kwargs)
        if source_format == "vit_ft":
            state_dict, discarded = strip_prefix(state_dict), []
        else:
            state_dict, discarded = convert_hf_vit_state_dict(state_dict)
        report = LoadingReport(source=source, source_format=source_format)
        report.discarded.update(
            {k: "pre-logits pooler, removed for fine-tuning as in the ViT paper" for k in discarded}
        )

        model = cls(config)
        own = model.state_dict()
        prefix = "" if isinstance(model, ViTFTModel) else f"{cls.base_model_prefix}."
        own_key = {k.removeprefix(prefix): k for k in own}  # our unprefixed key -> the model's key
        expected = {short: own[key].shape for short, key in own_key.items()}
        keep_head = (
            config.num_labels == source_config.num_labels and config.id2label == source_config.id2label
        )
        state_dict = adapt_state_dict(
            state_dict, expected, source_config.grid_size, config.grid_size, report, keep_head
        )
        for key in report.newly_initialized:
            state_dict[key] = own[own_key[key]]
        model.load_state_dict({own_key[k]: v for k, v in state_dict.items()}, strict=True)
        if dtype is not None:
            model.to(getattr(torch, dtype) if isinstance(dtype, str) else dtype)
        model.name_or_path = source
        model.config._name_or_path = source
        model.loading_report = report
        model.eval()
        logger.info("%s", report)
        if output_loading_info:
            info = {
                "missing_keys": report.newly_initialized,
                "unexpected_keys": list(report.discarded),
                "mismatched_keys": [],
                "error_msgs": [],
            }
            return model, info
        return model


def _source_config(source_dict: dict[str, Any], source: str) -> tuple[ViTFTConfig, str]:
    """The checkpoint's architecture as a ViTFTConfig, and its format ("vit_ft" or a transformers class)."""
    model_type = source_dict.get("model_type")
    if model_type == "vit_ft":
        return ViTFTConfig.from_dict(source_dict), "vit_ft"
    if model_type != "vit":
        raise ValueError(
            f"{source} has model_type {model_type!r}; vit_ft loads transformers ViT checkpoints (model_type 'vit', "
            "e.g. google/vit-base-patch16-224-in21k) and its own folders (model_type 'vit_ft')."
        )
    fields = {name: source_dict[name] for name in VIT_CONFIG_FIELDS if name in source_dict}
    architectures = source_dict.get("architectures") or ["ViTModel"]
    if "ViTForImageClassification" in architectures and "id2label" in source_dict:
        fields["id2label"] = source_dict["id2label"]
        fields["label2id"] = source_dict.get("label2id")
    else:
        fields["num_labels"] = 0  # a backbone checkpoint: no head, no label names to carry over
    return ViTFTConfig(**fields), f"transformers {architectures[0]}"


def _target_config(source_config: ViTFTConfig, overrides: dict[str, Any]) -> ViTFTConfig:
    """The source's config with `overrides` applied; unknown fields are an error naming them."""
    values = source_config.to_dict()
    for key in ("architectures", "auto_map", "transformers_version", "model_type", "_name_or_path"):
        values.pop(key, None)
    if {"num_labels", "id2label"} & set(overrides):
        values.pop("id2label", None)
        values.pop("label2id", None)
        if "id2label" in overrides and "label2id" not in overrides and overrides["id2label"] is not None:
            overrides = {**overrides, "label2id": {v: int(k) for k, v in overrides["id2label"].items()}}
    known = (
        set(values) | set(ViTFTConfig().to_dict()) | {"num_labels", "id2label", "label2id", "problem_type"}
    )
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise TypeError(
            f"Unknown from_pretrained argument(s) {unknown}: pass ViTFTConfig fields or hub options {HUB_KWARGS}."
        )
    if "image_size" in overrides and overrides["image_size"] is not None:
        overrides = {**overrides, "image_size": list(to_2tuple(overrides["image_size"], "image_size"))}
    overrides = {k: v for k, v in overrides.items() if v is not None or k == "problem_type"}
    if (
        "num_labels" in overrides
        and "id2label" in overrides
        and len(overrides["id2label"]) != overrides["num_labels"]
    ):
        raise ValueError(
            f"num_labels={overrides['num_labels']} but id2label has {len(overrides['id2label'])} entries."
        )
    if "num_labels" in overrides and "id2label" in overrides:
        overrides.pop("num_labels")
    return ViTFTConfig(**{**values, **overrides})


def _read_safetensors(source: str, hub_kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint's safetensors file(s), single or sharded."""
    common = {"_raise_exceptions_for_missing_entries": False, **hub_kwargs}
    single = cached_file(source, "model.safetensors", **common)
    if single is not None:
        return load_file(single)
    index = cached_file(source, "model.safetensors.index.json", **common)
    if index is None:
        raise FileNotFoundError(
            f"No model.safetensors in {source}. vit_ft reads safetensors weights only: convert a pytorch_model.bin "
            "checkpoint by loading it with transformers and calling save_pretrained (safetensors is the default)."
        )
    with open(index, encoding="utf-8") as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
    state_dict: dict[str, torch.Tensor] = {}
    for shard in shards:
        state_dict.update(load_file(cached_file(source, shard, **hub_kwargs)))
    return state_dict


class ViTFTModel(ViTFTPreTrainedModel):
    """The ViT encoder. `pooler_output` is the CLS token (or the patch-token mean) after the final LayerNorm."""

    def __init__(self, config: ViTFTConfig):
        super().__init__(config)
        self.embeddings = ViTFTEmbeddings(config)
        self.layers = nn.ModuleList([ViTFTLayer(config) for _ in range(config.num_hidden_layers)])
        self.layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.embeddings.patch_embeddings

    def forward_features(
        self, pixel_values: torch.Tensor, output_attentions: bool = False, output_hidden_states: bool = False
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None, tuple[torch.Tensor, ...] | None]:
        """`(batch, channels, height, width)` -> normalised tokens `(batch, 1 + num_patches, hidden)`."""
        pixel_values = pixel_values.to(self.embeddings.patch_embeddings.projection.weight.dtype)
        hidden_states = self.embeddings(pixel_values)
        all_hidden = (hidden_states,) if output_hidden_states else None
        all_attentions = () if output_attentions else None
        for layer in self.layers:
            hidden_states, attn_weights = layer(hidden_states, output_attentions=output_attentions)
            if output_hidden_states:
                all_hidden += (hidden_states,)
            if output_attentions:
                all_attentions += (attn_weights,)
        return self.layernorm(hidden_states), all_hidden, all_attentions

    def forward_head(self, sequence_output: torch.Tensor) -> torch.Tensor:
        """Pool `(batch, 1 + num_patches, hidden)` tokens to `(batch, hidden)`."""
        if self.config.pooling == "mean":
            return sequence_output[:, 1:].mean(dim=1)
        return sequence_output[:, 0]

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        interpolate_pos_encoding: bool | None = None,  # accepted for transformers compatibility; always on
        **kwargs: Any,
    ) -> BaseModelOutputWithPooling | tuple:
        if pixel_values is None:
            raise ValueError("pixel_values is required: a (batch, channels, height, width) float tensor.")
        output_attentions = self.config.output_attentions if output_attentions is None else output_attentions
        output_hidden_states = (
            self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        )
        return_dict = self.config.return_dict if return_dict is None else return_dict
        sequence_output, hidden_states, attentions = self.forward_features(
            pixel_values, output_attentions, output_hidden_states
        )
        pooled_output = self.forward_head(sequence_output)
        if not return_dict:
            return tuple(
                v for v in (sequence_output, pooled_output, hidden_states, attentions) if v is not None
            )
        return BaseModelOutputWithPooling(
            last_hidden_state=sequence_output,
            pooler_output=pooled_output,
            hidden_states=hidden_states,
            attentions=attentions,
        )


def classification_loss(logits: torch.Tensor, labels: torch.Tensor, config: ViTFTConfig) -> torch.Tensor:
    """The loss of transformers' `problem_type` convention: MSE, cross-entropy or BCE-with-logits."""
    problem_type = config.problem_type
    if problem_type is None:
        if config.num_labels == 1:
            problem_type = "regression"
        elif labels.dtype in (torch.long, torch.int):
            problem_type = "single_label_classification"
        else:
            problem_type = "multi_label_classification"
    if problem_type == "regression":
        return (
            F.mse_loss(logits.squeeze(-1).float(), labels.squeeze(-1).float())
            if config.num_labels == 1
            else F.mse_loss(logits.float(), labels.float())
        )
    if problem_type == "single_label_classification":
        return F.cross_entropy(logits.view(-1, config.num_labels).float(), labels.view(-1))
    return F.binary_cross_entropy_with_logits(logits.float(), labels.to(logits.dtype).float())


class ViTFTForImageClassification(ViTFTPreTrainedModel):
    """ViT with a linear head on the pooled token (CLS by default); the head starts at zero."""

    def __init__(self, config: ViTFTConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.vit = ViTFTModel(config)
        self.classifier = (
            ViTFTLinear(config.hidden_size, config.num_labels) if config.num_labels > 0 else nn.Identity()
        )
        self.post_init()

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        interpolate_pos_encoding: bool | None = None,  # accepted for transformers compatibility; always on
        **kwargs: Any,
    ) -> ImageClassifierOutput | tuple:
        return_dict = self.config.return_dict if return_dict is None else return_dict
        outputs = self.vit(
            pixel_values,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        logits = self.classifier(outputs.pooler_output)  # (B, num_labels)
        loss = classification_loss(logits, labels, self.config) if labels is not None else None
        if not return_dict:
            output = tuple(v for v in (logits, outputs.hidden_states, outputs.attentions) if v is not None)
            return (loss, *output) if loss is not None else output
        return ImageClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


__all__ = ["ViTFTForImageClassification", "ViTFTModel", "ViTFTPreTrainedModel", "classification_loss"]
