"""The vit_ft Vision Transformer (arXiv 2010.11929) with timm's family options (DeiT, DINOv2/v3, CLIP, SigLIP (2,
NaFlex), MAE, MSN, MetaCLIP 2, AIMv2) and VPT's prompts, a PreTrainedModel read top to bottom like `modeling_vit.py`.
A saved folder runs with this file and the modules it imports (configuration, sizes, inputs, naflex, norms, pos_embed,
prompts, rotary, knn_head); checkpoint formats (`loading.py`) and the CPU kernels (`kernelize`) act from outside."""

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

from .configuration_vit_ft import ViTFTConfig
from .inputs import check_image_size, check_inputs, patch_grid
from .knn_head import make_head
from .naflex import attention_bias, masked_mean, naflex_positions, patchified_projection
from .norms import RMSNorm, make_norm
from .pos_embed import resample_position_embeddings
from .prompts import ViTFTPrompts, without_prompts
from .rotary import apply_rotary, rotary_cos_sin


class ViTFTPatchEmbeddings(nn.Module):
    """`(batch, channels, height, width)` pixels, or NaFlex patches `(batch, num_patches, patch_h * patch_w *
    channels)`, -> `(batch, num_patches, hidden)` patch embeddings, normalised with `patch_norm` (AIMv2)."""

    def __init__(self, config: ViTFTConfig):
        super().__init__()
        patch = self.patch_size = config.patch_hw
        bias = not config.pre_norm  # timm's rule: no patch bias under a pre-norm (CLIP)
        self.projection = nn.Conv2d(config.num_channels, config.hidden_size, patch, patch, bias=bias)
        self.norm = make_norm(config) if config.patch_norm else nn.Identity()

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        if pixel_values.dim() == 3:  # NaFlex: the convolution as a linear map over the patches (`naflex.py`)
            return self.norm(patchified_projection(self.projection, pixel_values))
        return self.norm(self.projection(pixel_values).flatten(2).transpose(1, 2))  # (B, N, hidden)


class ViTFTEmbeddings(nn.Module):
    """Prefix tokens (class, distillation, registers) + patch embeddings + learned position embeddings, resampled
    when the input size differs (none under rotary ones), or resized per image for NaFlex patches (`naflex.py`,
    with `spatial_shapes`). Without `no_embed_class` the class/distillation tokens have position slots."""

    def __init__(self, config: ViTFTConfig):
        super().__init__()
        self.patch_size, self.grid_size = config.patch_hw, config.grid_size
        check_image_size(config.image_hw, self.patch_size)
        hidden, registers, self.config = config.hidden_size, config.num_register_tokens, config
        self.cls_token = nn.Parameter(torch.zeros(1, 1, hidden)) if config.class_token else None
        self.distillation_token = nn.Parameter(torch.zeros(1, 1, hidden)) if config.distillation_token else None
        self.register_tokens = nn.Parameter(torch.zeros(1, registers, hidden)) if registers else None
        self.patch_embeddings = ViTFTPatchEmbeddings(config)
        num_positions = self.grid_size[0] * self.grid_size[1] + config.num_position_prefix
        learned = config.rope_theta is None
        self.position_embeddings = nn.Parameter(torch.zeros(1, num_positions, hidden)) if learned else None
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, pixel_values: torch.Tensor, spatial_shapes: torch.Tensor | None = None) -> torch.Tensor:
        batch_size, cfg, table, pos = pixel_values.shape[0], self.config, self.position_embeddings, 0.0
        grid = None if spatial_shapes is not None else patch_grid(*pixel_values.shape[2:], self.patch_size)  # first
        embeddings = self.patch_embeddings(pixel_values)  # (B, N, hidden), of images or of NaFlex patches
        if spatial_shapes is not None and table is not None:  # NaFlex: the table resized to each image's grid
            pos = naflex_positions(self, spatial_shapes, pixel_values.shape[1])  # (B, prefix + N, hidden)
        elif table is not None:  # rotary positions are applied in attention
            args = (self.grid_size, grid, cfg.num_position_prefix, cfg.pos_embed_antialias)
            pos = resample_position_embeddings(table, *args)
        tokens = [t for t in (self.cls_token, self.distillation_token) if t is not None]
        prefix = [t.expand(batch_size, -1, -1) for t in tokens]  # each (B, 1, hidden)
        if cfg.no_embed_class:  # timm's option: the prefix tokens have no position
            embeddings = torch.cat([*prefix, embeddings + pos], dim=1)  # (B, prefix + N, hidden)
        else:
            embeddings = torch.cat([*prefix, embeddings], dim=1) + pos  # (B, prefix + N, hidden)
        if self.register_tokens is not None:  # after the class/distillation tokens, never a position (DINOv2)
            registers = self.register_tokens.expand(batch_size, -1, -1)  # (B, registers, hidden)
            embeddings = torch.cat([embeddings[:, : len(prefix)], registers, embeddings[:, len(prefix) :]], 1)
        return self.dropout(embeddings)


def eager_attention_forward(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0, **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The reference attention, as transformers' ViT: `(B, heads, N, head_dim)` x3 -> `(B, N, heads, head_dim)`
    and the maps `(B, heads, N, N)`."""
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling  # (B, heads, N, N)
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_weights = nn.functional.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value).transpose(1, 2).contiguous()  # (B, N, heads, head_dim)
    return attn_output, attn_weights


class ViTFTAttention(nn.Module):
    """Multi-head self-attention with one fused qkv projection, and rotary positions (`rope`: cos, sin) on the
    patch tokens where given. The attention function comes from transformers' registry by
    `config._attn_implementation`; `output_attentions=True` takes the eager path, which returns the maps."""

    def __init__(self, config: ViTFTConfig):
        super().__init__()
        if config.hidden_size % config.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size ({config.hidden_size}) must be divisible by num_attention_heads "
                f"({config.num_attention_heads}); pick a head count that divides it, e.g. "
                f"{[h for h in range(1, 33) if config.hidden_size % h == 0][-3:]}."
            )
        self.config, self.num_heads = config, config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout, self.is_causal = config.attention_probs_dropout_prob, False
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=config.qkv_bias)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size, bias=config.proj_bias)

    def forward(
        self, hidden_states: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch_size, seq_len, hidden = hidden_states.shape
        qkv = self.qkv(hidden_states).view(batch_size, seq_len, 3, self.num_heads, self.head_dim)
        # unbind before moving the heads forward: backward then stacks the gradients in qkv's own layout
        query, key, value = (t.transpose(1, 2) for t in qkv.unbind(2))  # each (B, heads, N, head_dim)
        if rope is not None:
            query, key = apply_rotary(query, key, *rope)
        attention_interface: Callable = eager_attention_forward
        if not kwargs.get("output_attentions"):
            attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(
                self.config._attn_implementation, eager_attention_forward
            )
        # NaFlex's padding: an additive (B, 1, 1, N) key mask
        dropout, mask = (self.attention_dropout if self.training else 0.0), kwargs.pop("attention_mask", None)
        attn_output, attn_weights = attention_interface(
            self, query, key, value, mask, dropout=dropout, scaling=self.scaling, **kwargs
        )
        attn_output = attn_output.reshape(batch_size, seq_len, hidden)  # (B, N, hidden)
        return self.proj(attn_output), attn_weights


class ViTFTMLP(nn.Module):
    """`(batch, seq_len, hidden)` -> fc2(act(fc1(x))), or with `swiglu` fc2(silu(gate) * value) (timm's SwiGLUPacked)"""

    def __init__(self, config: ViTFTConfig, swiglu: bool = False):
        super().__init__()
        self.config, self.swiglu = config, swiglu
        width, bias = config.intermediate_size, config.mlp_bias
        self.fc1 = nn.Linear(config.hidden_size, (1 + swiglu) * width, bias=bias)
        if not swiglu:  # the kernels fuse an MLP with an exact-GELU `activation_fn`; a SwiGLU one has none
            self.activation_fn = ACT2FN[config.hidden_act]
        self.fc2 = nn.Linear(width, config.hidden_size, bias=bias)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.swiglu:
            gate, value = self.fc1(hidden_states).chunk(2, dim=-1)  # each (B, N, intermediate)
            return self.fc2(nn.functional.silu(gate) * value)
        return self.fc2(self.activation_fn(self.fc1(hidden_states)))


class ViTFTAttentionPool(nn.Module):
    """Attention pooling (SigLIP's MAP head, timm's `AttentionPoolLatent`): a learned query attends over the
    `(batch, seq_len, hidden)` tokens, then a residual MLP; -> `(batch, hidden)`. Pooling "attn" (AIMv2's head)
    has no query projection and no MLP, and key/value biases only with `qkv_bias`."""

    def __init__(self, config: ViTFTConfig):
        super().__init__()
        self.num_heads, hidden, full = config.num_attention_heads, config.hidden_size, config.pooling == "map"
        self.latent = nn.Parameter(torch.zeros(1, 1, hidden))
        self.q = nn.Linear(hidden, hidden) if full else nn.Identity()
        self.kv = nn.Linear(hidden, 2 * hidden, bias=full or config.qkv_bias)
        self.proj = nn.Linear(hidden, hidden)
        self.norm, self.mlp = (make_norm(config), ViTFTMLP(config)) if full else (None, None)

    def forward(self, hidden_states: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        batch_size, seq_len, hidden = hidden_states.shape
        heads, head_dim = self.num_heads, hidden // self.num_heads
        query = self.q(self.latent).view(1, heads, 1, head_dim).expand(batch_size, -1, -1, -1)
        kv = self.kv(hidden_states).view(batch_size, seq_len, 2, heads, head_dim)
        key, value = kv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, heads, N, head_dim)
        bias = attention_bias(mask, query.dtype)  # only the valid tokens (NaFlex)
        pooled = nn.functional.scaled_dot_product_attention(query, key, value, bias).reshape(batch_size, hidden)
        pooled = self.proj(pooled)  # (B, hidden)
        return pooled if self.mlp is None else pooled + self.mlp(self.norm(pooled))


class ViTFTLayer(GradientCheckpointingLayer):
    """Pre-norm encoder block: x + DropPath(LS(Attn(LN(x)))), then x + DropPath(LS(MLP(LN(x)))); layer scale
    (`ls1`, `ls2`: per-channel gains) only with `layerscale_value`, drop path only with a rate > 0."""

    def __init__(self, config: ViTFTConfig, drop_path_rate: float = 0.0):
        super().__init__()
        self.norm1 = make_norm(config)
        self.attention = ViTFTAttention(config)
        self.norm2 = make_norm(config)
        self.mlp = ViTFTMLP(config, swiglu=config.mlp_type == "swiglu")
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.drop_path_rate = drop_path_rate
        self.ls1 = self.ls2 = None
        if config.layerscale_value is not None:
            self.ls1 = nn.Parameter(torch.full((config.hidden_size,), float(config.layerscale_value)))
            self.ls2 = nn.Parameter(torch.full((config.hidden_size,), float(config.layerscale_value)))

    def residual(self, branch: torch.Tensor, gain: torch.Tensor | None) -> torch.Tensor:
        """A residual branch's dropout, layer scale, then drop path (stochastic depth, arXiv 1603.09382) as timm's
        `drop_path`: a sample's whole branch dropped with probability rate, kept ones scaled by 1 / (1 - rate)."""
        branch = self.dropout(branch) if gain is None else self.dropout(branch) * gain
        if self.drop_path_rate == 0.0 or not self.training:
            return branch
        keep = branch.new_empty((branch.shape[0], 1, 1)).bernoulli_(1.0 - self.drop_path_rate)  # (B, 1, 1)
        return branch * keep.div_(1.0 - self.drop_path_rate)

    def forward(self, hidden_states: torch.Tensor, rope: Any = None, **kwargs: Any) -> torch.Tensor:
        attn_output, _ = self.attention(self.norm1(hidden_states), rope, **kwargs)
        hidden_states = hidden_states + self.residual(attn_output, self.ls1)
        return hidden_states + self.residual(self.mlp(self.norm2(hidden_states)), self.ls2)


class ViTFTPreTrainedModel(PreTrainedModel):
    config_class = ViTFTConfig
    config: ViTFTConfig
    base_model_prefix = "vit"
    main_input_name = "pixel_values"
    input_modalities = ("image",)
    supports_gradient_checkpointing = True
    _no_split_modules = ["ViTFTEmbeddings", "ViTFTLayer"]
    # as transformers' ViT declares them; each is exercised in tests/model/test_capabilities.py
    _supports_sdpa = _supports_flash_attn = True
    _supports_flex_attn = _supports_attention_backend = True
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
        heads = (getattr(self, "classifier", None), getattr(self, "distillation_classifier", None))
        if any(module is head for head in heads) and isinstance(module, nn.Linear):
            init.zeros_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, (nn.Linear, nn.Conv2d)):
            init.trunc_normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, (nn.LayerNorm, RMSNorm)):
            init.ones_(module.weight)
            if getattr(module, "bias", None) is not None:
                init.zeros_(module.bias)
        elif isinstance(module, ViTFTEmbeddings):
            tokens = ("position_embeddings", "cls_token", "distillation_token", "register_tokens")
            for token in (getattr(module, name) for name in tokens if getattr(module, name) is not None):
                init.trunc_normal_(token, mean=0.0, std=std)
        elif isinstance(module, ViTFTLayer) and module.ls1 is not None:
            init.constant_(module.ls1, self.config.layerscale_value)
            init.constant_(module.ls2, self.config.layerscale_value)
        elif isinstance(module, ViTFTAttentionPool):
            init.trunc_normal_(module.latent, mean=0.0, std=std)
        elif isinstance(module, ViTFTPrompts):
            module.reset_parameters()

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: Any, *model_args: Any, **kwargs: Any):
        """transformers' `from_pretrained`, through `checkpoint_loader` where one is installed."""
        load = super().from_pretrained
        if cls.checkpoint_loader is None:
            return load(pretrained_model_name_or_path, *model_args, **kwargs)
        return cls.checkpoint_loader.from_pretrained(load, pretrained_model_name_or_path, *model_args, **kwargs)

    def _adjust_missing_and_unexpected_keys(self, loading_info: Any) -> None:
        """transformers' hook after the weights are in (the keys it ignores), then `checkpoint_loader`'s."""
        super()._adjust_missing_and_unexpected_keys(loading_info)
        if self.checkpoint_loader is not None:
            self.checkpoint_loader.adjust_loading_info(self, loading_info)

    def no_weight_decay(self) -> set[str]:
        """Parameter names that optimizers conventionally exclude from weight decay (timm's habit)."""
        kinds = ("cls_token", "distillation_token", "register_tokens", "position_embeddings")
        return {name for name, _ in self.named_parameters() if name.rsplit(".", 1)[-1] in kinds}


class ViTFTModel(ViTFTPreTrainedModel):
    """The ViT encoder. `pooler_output` is the pooled tokens (`pooling`) after the final norm;
    `hidden_states` and `attentions` are recorded by transformers' `capture_outputs` when asked for."""

    def __init__(self, config: ViTFTConfig):
        super().__init__(config)
        self.embeddings = ViTFTEmbeddings(config)
        self.pre_layernorm = make_norm(config) if config.pre_norm else None
        # stochastic depth rising linearly with depth (DeiT, timm); on the CPU explicitly, as transformers' models
        # do, so that the model also builds on the meta device (init_empty_weights, device_map, FSDP loading)
        rates = torch.linspace(0, config.drop_path_rate, config.num_hidden_layers, device="cpu").tolist()
        self.layers = nn.ModuleList([ViTFTLayer(config, rate) for rate in rates])
        self.prompts = ViTFTPrompts(config) if config.vpt_tokens else None  # VPT (`prompts.py`)
        # the final LayerNorm on every token, or with `fc_norm` on the pooled one (MAE's fine-tuning layout)
        self.layernorm = None if config.fc_norm else make_norm(config)
        self.attn_pool = ViTFTAttentionPool(config) if config.pooling in ("map", "attn") else None
        self.fc_norm = make_norm(config) if config.fc_norm else None
        self.gradient_checkpointing = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return self.embeddings.patch_embeddings

    def forward_features(self, pixel_values: torch.Tensor, mask: Any = None, spatial_shapes: Any = None, **kwargs):
        """`(batch, channels, height, width)`, or NaFlex patches with their token `mask` and `spatial_shapes` ->
        tokens `(batch, prefix + num_patches, hidden)`, normalised unless the norm follows the pooling (`fc_norm`)."""
        rope, cfg = None, self.config
        pixel_values = pixel_values.to(self.embeddings.patch_embeddings.projection.weight.dtype)
        hidden_states = self.embeddings(pixel_values, spatial_shapes)  # (B, prefix + N, hidden)
        kwargs["attention_mask"] = attention_bias(mask, hidden_states.dtype)
        if cfg.rope_theta is not None:
            grid = patch_grid(*pixel_values.shape[2:], self.embeddings.patch_size)
            head_dim = cfg.hidden_size // cfg.num_attention_heads
            augment = (cfg.rope_shift, cfg.rope_jitter, cfg.rope_rescale) if self.training else None
            rope = rotary_cos_sin(grid, head_dim, cfg.rope_theta, hidden_states.dtype, hidden_states.device, augment)
        if self.pre_layernorm is not None:
            hidden_states = self.pre_layernorm(hidden_states)
        for index, layer in enumerate(self.layers):
            if self.prompts is not None:  # VPT: the prompts inserted before the first block (deep: replaced)
                hidden_states = self.prompts(hidden_states, index)  # (B, prefix + prompts + N, hidden)
            hidden_states = layer(hidden_states, rope, **kwargs)
        return hidden_states if self.layernorm is None else self.layernorm(hidden_states)

    def forward_head(self, sequence_output: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Pool `(batch, prefix + num_patches, hidden)` tokens (the valid ones of the token `mask` where given) to
        `(batch, hidden)` (`2 * hidden` for cls+mean)."""
        pooling, prefix = self.config.pooling, self.config.num_prefix_tokens
        if self.attn_pool is not None:
            pooled = self.attn_pool(*without_prompts(sequence_output, mask, self.config))
        elif pooling == "mean":
            pooled = masked_mean(sequence_output, mask, prefix)
        elif pooling == "cls+mean":
            return torch.cat([sequence_output[:, 0], masked_mean(sequence_output, mask, prefix)], dim=-1)
        else:
            pooled = sequence_output[:, 0]
        return pooled if self.fc_norm is None else self.fc_norm(pooled)

    # the hidden states are the layers' outputs before the final LayerNorm, as transformers' ViT returns them
    @capture_outputs(tie_last_hidden_states=False)
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        pixel_attention_mask: torch.Tensor | None = None,  # NaFlex (`naflex.py`): the padding, (B, max_patches)
        spatial_shapes: torch.Tensor | None = None,  # NaFlex: each image's patch grid, (B, 2)
        interpolate_pos_encoding: bool | None = None,  # accepted for transformers compatibility; always on
        **kwargs: Any,
    ) -> BaseModelOutputWithPooling:
        mask = check_inputs(pixel_values, pixel_attention_mask, spatial_shapes, self.config)  # NaFlex's, or None
        sequence_output = self.forward_features(pixel_values, mask, spatial_shapes, **kwargs)
        pooled = self.forward_head(sequence_output, mask)
        return BaseModelOutputWithPooling(last_hidden_state=sequence_output, pooler_output=pooled)


class ViTFTForImageClassification(ViTFTPreTrainedModel):
    """ViT with a linear head on the pooled token (CLS by default); the head starts at zero. With a distillation
    token, a second head on it and the two logits averaged, as DeiT's `ForImageClassificationWithTeacher`."""

    def __init__(self, config: ViTFTConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.vit = ViTFTModel(config)
        hidden, labels = config.hidden_size, config.num_labels
        features = 2 * hidden if config.pooling == "cls+mean" else hidden
        self.classifier = make_head(config, features)  # linear, or the kNN vote over a feature bank
        if config.distillation_token:
            self.distillation_classifier = nn.Linear(hidden, labels) if labels > 0 else nn.Identity()
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        pixel_attention_mask: torch.Tensor | None = None,  # NaFlex inputs (`naflex.py`)
        spatial_shapes: torch.Tensor | None = None,
        interpolate_pos_encoding: bool | None = None,  # accepted for transformers compatibility; always on
        **kwargs: Any,
    ) -> ImageClassifierOutput:
        outputs: BaseModelOutputWithPooling = self.vit(pixel_values, pixel_attention_mask, spatial_shapes, **kwargs)
        logits = self.classifier(outputs.pooler_output)  # (B, num_labels)
        if self.config.distillation_token:  # timm and transformers average both heads when not distilling
            logits = (logits + self.distillation_classifier(outputs.last_hidden_state[:, 1])) / 2
        # transformers' problem_type rule; in float32 also for a bf16 model, as Trainer logs it
        loss = None if labels is None else self.loss_function(labels, logits.float(), self.config, **kwargs)
        return ImageClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


__all__ = ["ViTFTForImageClassification", "ViTFTModel", "ViTFTPreTrainedModel"]
