"""The vit_ft Vision Transformer (arXiv 2010.11929) as a transformers PreTrainedModel.

Reads top to bottom like transformers' `models/vit/modeling_vit.py`: PatchEmbeddings -> Embeddings -> Attention ->
MLP -> Layer -> PreTrainedModel -> Model -> ForImageClassification. Plain PyTorch + transformers (`nn.Linear`, the
attention registry, the output-recording decorators, `loss_function`), so a saved folder runs with only this file,
`configuration_vit_ft.py`, `sizes.py` and `pos_embed.py` (`trust_remote_code=True`). Checkpoint formats and the
loading report are loading code (`loading.py`, through the `checkpoint_loader` hook); the CPU kernels are applied
from outside (`vit_ft.kernels.kernelize`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPooling, ImageClassifierOutput
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.utils.generic import can_return_tuple
from transformers.utils.output_capturing import capture_outputs

from .configuration_vit_ft import ViTFTConfig, nearest_multiple
from .pos_embed import resample_position_embeddings


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
        image_hw = config.image_hw
        if min(image_hw) <= 0 or image_hw[0] % self.patch_size[0] or image_hw[1] % self.patch_size[1]:
            raise ValueError(
                f"image_size {image_hw} is not divisible by patch_size {self.patch_size}: use a multiple of the "
                f"patch size, e.g. {nearest_multiple(image_hw, self.patch_size)}."
            )
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


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference attention: `(B, heads, N, head_dim)` x3 -> output `(B, N, heads, head_dim)` and the maps
    `(B, heads, N, N)`, computed as transformers' ViT does."""
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling  # (B, heads, N, N)
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value).transpose(1, 2).contiguous()  # (B, N, heads, head_dim)
    return attn_output, attn_weights


class ViTFTAttention(nn.Module):
    """Multi-head self-attention with one fused qkv projection. The attention function comes from transformers'
    registry by `config._attn_implementation` ("sdpa" by default, "eager" as the reference, or any registered
    one); `output_attentions=True` takes the eager path, which returns the maps."""

    def __init__(self, config: ViTFTConfig):
        super().__init__()
        if config.hidden_size % config.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size ({config.hidden_size}) must be divisible by num_attention_heads "
                f"({config.num_attention_heads}); pick a head count that divides it, e.g. "
                f"{[h for h in range(1, 33) if config.hidden_size % h == 0][-3:]}."
            )
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_probs_dropout_prob
        self.is_causal = False
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.qkv_bias)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch_size, seq_len, hidden = hidden_states.shape
        qkv = self.qkv(hidden_states).view(batch_size, seq_len, 3, self.num_heads, self.head_dim)
        # unbind before moving the heads forward: backward then stacks the gradients in qkv's own layout
        query, key, value = (t.transpose(1, 2) for t in qkv.unbind(2))  # each (B, heads, N, head_dim)
        attention_interface: Callable = eager_attention_forward
        if not kwargs.get("output_attentions"):
            attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(
                self.config._attn_implementation, eager_attention_forward
            )
        attn_output, attn_weights = attention_interface(
            self,
            query,
            key,
            value,
            None,
            dropout=self.attention_dropout if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        attn_output = attn_output.reshape(batch_size, seq_len, hidden)  # (B, N, hidden)
        return self.proj(attn_output), attn_weights


class ViTFTMLP(nn.Module):
    def __init__(self, config: ViTFTConfig):
        super().__init__()
        self.config = config
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.activation_fn = ACT2FN[config.hidden_act]
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.activation_fn(self.fc1(hidden_states)))


class ViTFTLayer(GradientCheckpointingLayer):
    """Pre-norm encoder block: x + Attn(LN(x)), then x + MLP(LN(x))."""

    def __init__(self, config: ViTFTConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attention = ViTFTAttention(config)
        self.norm2 = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = ViTFTMLP(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        attn_output, _ = self.attention(self.norm1(hidden_states), **kwargs)
        hidden_states = hidden_states + self.dropout(attn_output)
        return hidden_states + self.dropout(self.mlp(self.norm2(hidden_states)))


class ViTFTPreTrainedModel(PreTrainedModel):
    config_class = ViTFTConfig
    config: ViTFTConfig
    base_model_prefix = "vit"
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    supports_gradient_checkpointing = True
    _no_split_modules = ["ViTFTEmbeddings", "ViTFTLayer"]
    # as transformers' ViT declares them; each is exercised in tests/model/test_capabilities.py
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _supports_attention_backend = True
    _can_compile_fullgraph = True
    _can_record_outputs = {"hidden_states": ViTFTLayer, "attentions": ViTFTAttention}
    # Trainer scales the loss itself under accumulation / several processes (the loss takes no num_items_in_batch)
    accepts_loss_kwargs = False
    # Loading beyond transformers' own (other checkpoint formats, the loading report), installed by
    # vit_ft.model.loading; None in a saved folder's copy of this file, which loads as any transformers model.
    checkpoint_loader = None

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

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: Any, *model_args: Any, **kwargs: Any):
        """transformers' `from_pretrained`, through `checkpoint_loader` where one is installed."""
        load = super().from_pretrained
        if cls.checkpoint_loader is None:
            return load(pretrained_model_name_or_path, *model_args, **kwargs)
        return cls.checkpoint_loader.from_pretrained(
            load, pretrained_model_name_or_path, *model_args, **kwargs
        )

    def _adjust_missing_and_unexpected_keys(self, loading_info: Any) -> None:
        """transformers' hook after the weights are in (the keys it ignores), then `checkpoint_loader`'s."""
        super()._adjust_missing_and_unexpected_keys(loading_info)
        if self.checkpoint_loader is not None:
            self.checkpoint_loader.adjust_loading_info(self, loading_info)

    def no_weight_decay(self) -> set[str]:
        """Parameter names that optimizers conventionally exclude from weight decay (timm's habit)."""
        prefix = "" if isinstance(self, ViTFTModel) else f"{self.base_model_prefix}."
        return {f"{prefix}embeddings.cls_token", f"{prefix}embeddings.position_embeddings"}


class ViTFTModel(ViTFTPreTrainedModel):
    """The ViT encoder. `pooler_output` is the CLS token (or the patch-token mean) after the final LayerNorm;
    `hidden_states` and `attentions` are recorded by transformers' `capture_outputs` when asked for."""

    def __init__(self, config: ViTFTConfig):
        super().__init__(config)
        self.embeddings = ViTFTEmbeddings(config)
        self.layers = nn.ModuleList([ViTFTLayer(config) for _ in range(config.num_hidden_layers)])
        self.layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.embeddings.patch_embeddings

    def forward_features(self, pixel_values: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """`(batch, channels, height, width)` -> normalised tokens `(batch, 1 + num_patches, hidden)`."""
        if not pixel_values.is_floating_point():  # a dtype check: free, and static under torch.compile
            raise ValueError(
                f"pixel_values is {pixel_values.dtype}: pass float pixels normalised as the model's image processor "
                "does (rescaled and normalised with its mean/std), not raw 0-255 integers."
            )
        pixel_values = pixel_values.to(self.embeddings.patch_embeddings.projection.weight.dtype)
        hidden_states = self.embeddings(pixel_values)  # (B, 1 + N, hidden)
        for layer in self.layers:
            hidden_states = layer(hidden_states, **kwargs)
        return self.layernorm(hidden_states)

    def forward_head(self, sequence_output: torch.Tensor) -> torch.Tensor:
        """Pool `(batch, 1 + num_patches, hidden)` tokens to `(batch, hidden)`."""
        if self.config.pooling == "mean":
            return sequence_output[:, 1:].mean(dim=1)
        return sequence_output[:, 0]

    # the hidden states are the layers' outputs before the final LayerNorm, as transformers' ViT returns them
    @capture_outputs(tie_last_hidden_states=False)
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        interpolate_pos_encoding: bool | None = None,  # accepted for transformers compatibility; always on
        **kwargs: Any,
    ) -> BaseModelOutputWithPooling:
        if pixel_values is None:
            raise ValueError("pixel_values is required: a (batch, channels, height, width) float tensor.")
        sequence_output = self.forward_features(pixel_values, **kwargs)
        return BaseModelOutputWithPooling(
            last_hidden_state=sequence_output, pooler_output=self.forward_head(sequence_output)
        )


class ViTFTForImageClassification(ViTFTPreTrainedModel):
    """ViT with a linear head on the pooled token (CLS by default); the head starts at zero."""

    def __init__(self, config: ViTFTConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.vit = ViTFTModel(config)
        self.classifier = (
            nn.Linear(config.hidden_size, config.num_labels) if config.num_labels > 0 else nn.Identity()
        )
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        interpolate_pos_encoding: bool | None = None,  # accepted for transformers compatibility; always on
        **kwargs: Any,
    ) -> ImageClassifierOutput:
        outputs: BaseModelOutputWithPooling = self.vit(pixel_values, **kwargs)
        logits = self.classifier(outputs.pooler_output)  # (B, num_labels)
        loss = None
        if (
            labels is not None
        ):  # transformers' problem_type rule; in float32 also for a bf16 model, as Trainer logs it
            loss = self.loss_function(labels, logits.float(), self.config, **kwargs)
        return ImageClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


__all__ = ["ViTFTForImageClassification", "ViTFTModel", "ViTFTPreTrainedModel"]
