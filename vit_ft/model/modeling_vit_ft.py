"""The vit_ft Vision Transformer (arXiv 2010.11929) as a transformers PreTrainedModel.

Reads top to bottom like transformers' `modeling_vit.py`: PatchEmbeddings -> Embeddings -> Attention -> MLP ->
Layer -> PreTrainedModel -> Model -> ForImageClassification. Loading is transformers' own `from_pretrained`:
`conversion.py` maps transformers ViT checkpoints to these modules (fused qkv, resampled position embeddings,
a new zero head for new labels) through transformers' weight-conversion hooks. The products run through
`kernels.py` (oneDNN on CPUs where it was measured to help, plain torch elsewhere).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.conversion_mapping import register_checkpoint_conversion_mapping
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPooling, ImageClassifierOutput
from transformers.modeling_utils import AttentionInterface

from .checkpoint_formats import (
    convert_jax_state_dict,
    find_jax_checkpoint,
    jax_config_fields,
    load_npz,
    read_npz_shapes,
)
from .configuration_vit_ft import ViTFTConfig, nearest_multiple
from .conversion import build_loading_report, checkpoint_conversion_mapping
from .pos_embed import resample_position_embeddings

# transformers' attention registry; the name is the one transformers looks for before it lets
# set_attn_implementation switch a model
ALL_ATTENTION_FUNCTIONS = AttentionInterface()


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
    attn_weights = F.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = F.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value).transpose(1, 2).contiguous()  # (B, N, heads, head_dim)
    return attn_output, attn_weights


class ViTFTAttention(nn.Module):
    """Multi-head self-attention with one fused qkv projection. The attention function comes from
    transformers' registry by `config._attn_implementation` ("sdpa" by default, "eager" as the reference);
    `output_attentions=True` takes the eager path, which returns the maps."""

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

    def forward(
        self, hidden_states: torch.Tensor, output_attentions: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch_size, seq_len, hidden = hidden_states.shape
        qkv = self.qkv(hidden_states).view(batch_size, seq_len, 3, self.num_heads, self.head_dim)
        # unbind before moving the heads forward: backward then stacks the gradients in qkv's own layout
        query, key, value = (t.transpose(1, 2) for t in qkv.unbind(2))  # each (B, heads, N, head_dim)
        attention_interface: Callable = eager_attention_forward
        if not output_attentions:
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
        )
        attn_output = attn_output.reshape(batch_size, seq_len, hidden)  # (B, N, hidden)
        return self.proj(attn_output), attn_weights


class ViTFTMLP(nn.Module):
    def __init__(self, config: ViTFTConfig):
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = ACT2FN[config.hidden_act]
        self.act_name = config.hidden_act
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
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

    def _adjust_missing_and_unexpected_keys(self, loading_info) -> None:
        """transformers' post-loading hook: the keys it ignores, then our loading report (`self.loading_report`:
        loaded, resampled, the head new or kept, newly initialised, discarded), logged once. A checkpoint key
        the model has no place for and that is not a known discard (the pre-logits pooler, a head this model
        lacks) is an error naming it.

        The missing keys our report names are held back from transformers' own LOAD REPORT, which would list
        the new head a second time as MISSING, and given back by `_finalize_model_loading`."""
        super()._adjust_missing_and_unexpected_keys(loading_info)
        self.loading_report = build_loading_report(self, loading_info)
        self.__dict__["_reported_missing"] = loading_info.missing_keys
        loading_info.missing_keys = set()

    @staticmethod
    def _finalize_model_loading(model, load_config, loading_info):
        """transformers' last loading step (initialisation, tying, the hook above, its report); then the missing
        keys are put back, so that `output_loading_info=True` lists them as for transformers' own ViT."""
        loading_info = PreTrainedModel._finalize_model_loading(model, load_config, loading_info)
        loading_info.missing_keys |= model.__dict__.pop("_reported_missing", set())
        return loading_info

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: Any, *model_args: Any, **kwargs: Any):
        """transformers' `from_pretrained`. A JAX `.npz` of the ViT paper (the file, or a folder holding one and
        no config.json) is converted first (`checkpoint_formats.py`) and loaded as a state dict, with its config
        read from the file, so resampling, the head rule and the loading report are the same."""
        npz = find_jax_checkpoint(pretrained_model_name_or_path)
        if npz is None or kwargs.get("state_dict") is not None:
            return super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        shapes_config = ViTFTConfig(**jax_config_fields(read_npz_shapes(npz), str(npz)))
        state_dict, discarded = convert_jax_state_dict(load_npz(npz), shapes_config)
        kwargs.setdefault("config", str(npz))
        model = super().from_pretrained(None, *model_args, state_dict=state_dict, **kwargs)
        model.config.name_or_path = str(npz)
        model.loading_report.discarded.update(discarded)
        return model

    def no_weight_decay(self) -> set[str]:
        """Parameter names that optimizers conventionally exclude from weight decay (timm's habit)."""
        prefix = "" if isinstance(self, ViTFTModel) else f"{self.base_model_prefix}."
        return {f"{prefix}embeddings.cls_token", f"{prefix}embeddings.position_embeddings"}


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
            nn.Linear(config.hidden_size, config.num_labels) if config.num_labels > 0 else nn.Identity()
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


# transformers ViT checkpoints load through transformers' own from_pretrained with this key/tensor conversion
register_checkpoint_conversion_mapping(
    ViTFTConfig.model_type, checkpoint_conversion_mapping(), overwrite=True
)

__all__ = ["ViTFTForImageClassification", "ViTFTModel", "ViTFTPreTrainedModel", "classification_loss"]
