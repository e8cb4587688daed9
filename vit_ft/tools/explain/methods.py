"""Explanation maps: one relevance per patch token for a target class (or, for rollout, for none).

- "grad_rollout": gradient-weighted attention rollout (Chefer et al. 2021, "Generic Attention-model
  Explainability", arXiv 2103.15679; `hila-chefer/Transformer-MM-Explainability`): R = I, then per block
  R += mean_heads(clamp(dS/dA * A, min=0)) @ R (rules 5 and 6), S the target's logit; read at the token(s) the
  head reads (the class token's row, with the distillation token's averaged in; the mean row under mean pooling).
- "gradcam": Grad-CAM (Selvaraju et al. 2017) on the last block's normalised input tokens, as pytorch-grad-cam
  does for a ViT (`target_layers=[blocks[-1].norm1]`, prefix tokens dropped): relu(sum_c mean_p(dS/dA_pc) A_pc).
- "integrated_gradients", "occlusion": captum's (the `explain` extra), model-agnostic references. Integrated
  gradients from the zero input (the normalisation's mean colour), summed over each patch's pixels and channels;
  occlusion of one patch at a time by that zero input, the drop of the target's logit.
- "rollout": the class-agnostic attention rollout (`rollout.py`, which inspect draws too), the baseline.

Every method takes a model's inputs as the model does (`(batch, channels, height, width)` pixels at any size the
model runs at, or a NaFlex batch: `pixel_values`, `pixel_attention_mask`, `spatial_shapes`) and returns
`(batch, num_patches)` float32 on the CPU, NaFlex padding at 0; `patch_grids` gives each image's grid.

    maps = explain(model, pixels, "grad_rollout", target=3)       # (batch, num_patches)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ...data.input_spec import patch_grids as batch_patch_grids
from ...data.input_spec import patch_window, per_patch, valid_patches
from .names import CAPTUM_METHODS, CLASS_SPECIFIC, METHODS, check_method_name
from .rollout import attention_rollout

IG_STEPS = 32  # captum's default is 50; 32 keeps the approximation error small at two thirds of the cost
Inputs = torch.Tensor | dict[str, torch.Tensor]


def _as_inputs(inputs: Inputs, device: torch.device) -> dict[str, torch.Tensor]:
    """The model's keyword inputs, as ordinary tensors on `device` (not inference tensors: gradients flow)."""
    given = inputs if isinstance(inputs, dict) else {"pixel_values": inputs}
    with torch.inference_mode(False):
        return {name: value.to(device).clone() for name, value in given.items()}


def patch_grids(maps: torch.Tensor, inputs: Inputs, patch_size: Sequence[int]) -> list[torch.Tensor]:
    """`(batch, num_patches)` maps -> each image's `(grid_h, grid_w)` map (its grid: `data.input_spec.patch_grids`)."""
    grids = batch_patch_grids(inputs, tuple(patch_size))
    return [m[: h * w].reshape(h, w) for m, (h, w) in zip(maps, grids, strict=True)]


def check_target(
    target: int | Sequence[int] | torch.Tensor | None, num_labels: int, batch: int
) -> torch.Tensor | None:
    """The target classes as a `(batch,)` long tensor (None stays None: the predicted class); a class index
    outside 0..num_labels-1 is a ValueError naming the range."""
    if target is None:
        return None
    target = torch.as_tensor(target, dtype=torch.long).flatten()
    target = target.expand(batch) if target.numel() == 1 else target
    if target.numel() != batch:
        raise ValueError(f"{target.numel()} target classes for {batch} images: pass one, or one per image.")
    bad = [int(t) for t in target if not 0 <= int(t) < num_labels]
    if bad:
        raise ValueError(f"target class {bad[0]} does not exist: this model has classes 0..{num_labels - 1}.")
    return target


def _scores(logits: torch.Tensor, target: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's logit per image `(batch,)` (the predicted class where `target` is None), and the targets."""
    if target is None:
        target = logits.detach().argmax(dim=-1)
    target = target.to(logits.device)
    return logits.gather(1, target[:, None])[:, 0], target


def _readout(relevance: torch.Tensor, config: Any, mask: torch.Tensor | None) -> torch.Tensor:
    """Token-to-token relevance `(batch, tokens, tokens)` -> `(batch, num_patches)`: the rows of the tokens the
    head reads (class token, with the distillation token averaged in; under mean, attention or cls+mean pooling
    the mean row over the valid patch tokens too), its columns over the patches."""
    prefix = config.num_prefix_tokens
    rows = []
    if config.class_token and config.pooling in ("cls", "cls+mean"):
        rows.append(relevance[:, : 1 + int(config.distillation_token)].mean(dim=1))  # (B, tokens)
    if config.pooling != "cls" or not config.class_token:
        patch_rows = relevance[:, prefix:]  # (B, N, tokens)
        if mask is None:
            rows.append(patch_rows.mean(dim=1))
        else:
            weights = mask.to(relevance.dtype)[:, :, None]
            rows.append((patch_rows * weights).sum(1) / weights.sum(1).clamp_min(1))
    return torch.stack(rows).mean(dim=0)[:, prefix:]


def _masked(maps: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    maps = maps.detach().float()
    return (maps if mask is None else maps * mask.to(maps.dtype)).cpu()


def gradient_rollout(
    model: torch.nn.Module, inputs: dict[str, torch.Tensor], target: torch.Tensor | None
) -> torch.Tensor:
    """Chefer et al. 2021b's relevance (see the module's docstring), `(batch, num_patches)`."""
    with torch.enable_grad():
        out = model(**inputs, output_attentions=True)  # the eager attention path: maps in the graph
        scores, _ = _scores(out.logits, target)
        grads = torch.autograd.grad(scores.sum(), out.attentions)  # images do not mix: one backward for all
    batch, _, tokens, _ = out.attentions[0].shape
    relevance = torch.eye(tokens, device=scores.device).expand(batch, tokens, tokens)
    for attention, grad in zip(out.attentions, grads, strict=True):
        cam = (
            (grad.float() * attention.detach().float()).clamp(min=0).mean(dim=1)
        )  # rule 5: (B, tokens, tokens)
        relevance = relevance + cam @ relevance  # rule 6
    return _masked(_readout(relevance, model.config, valid_patches(inputs)), valid_patches(inputs))


def grad_cam(
    model: torch.nn.Module, inputs: dict[str, torch.Tensor], target: torch.Tensor | None
) -> torch.Tensor:
    """Grad-CAM on the last block's `norm1` output `(batch, tokens, hidden)`, patch tokens only: `(batch,
    num_patches)`."""
    captured: list[torch.Tensor] = []
    hook = model.vit.layers[-1].norm1.register_forward_hook(
        lambda module, args, output: captured.append(output)
    )
    try:
        with torch.enable_grad():
            scores, _ = _scores(model(**inputs).logits, target)
            (grad,) = torch.autograd.grad(scores.sum(), captured[-1])
    finally:
        hook.remove()
    prefix, mask = model.config.num_prefix_tokens, valid_patches(inputs)
    acts, grad = captured[-1][:, prefix:].detach().float(), grad[:, prefix:].float()  # each (B, N, hidden)
    weights = mask[..., None].to(grad.dtype) if mask is not None else torch.ones_like(grad[..., :1])
    channel_weights = (grad * weights).sum(1, keepdim=True) / weights.sum(1, keepdim=True)  # (B, 1, hidden)
    return _masked(torch.relu((channel_weights * acts).sum(-1)), mask)


def _logit_function(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> tuple[Callable, tuple]:
    """A `pixel_values -> logits` function for captum, with the batch's other inputs as its extra arguments."""
    names = [name for name in inputs if name != "pixel_values"]

    def forward(pixel_values: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor:
        return model(pixel_values=pixel_values, **dict(zip(names, extra, strict=True))).logits

    return forward, tuple(inputs[name] for name in names)


def _per_patch(
    attribution: torch.Tensor, model: torch.nn.Module, inputs: dict[str, torch.Tensor], reduce: str
) -> torch.Tensor:
    """Pixel attributions (the input's shape) -> `(batch, num_patches)`, summed or averaged over each patch."""
    return _masked(per_patch(attribution, tuple(model.config.patch_hw), reduce), valid_patches(inputs))


def _captum():
    try:
        import captum.attr
    except ImportError as error:
        raise ValueError(
            "integrated_gradients and occlusion come from captum, which is not installed: pip install "
            "'vit-ft[explain]' (or captum), or use --explain grad_rollout / gradcam."
        ) from error
    return captum.attr


def integrated_gradients(
    model: torch.nn.Module,
    inputs: dict[str, torch.Tensor],
    target: torch.Tensor | None,
    steps: int = IG_STEPS,
) -> torch.Tensor:
    """captum's IntegratedGradients from the zero input, summed per patch: `(batch, num_patches)`."""
    forward, extra = _logit_function(model, inputs)
    pixels = inputs["pixel_values"]
    with torch.enable_grad():
        if target is None:
            target = forward(pixels, *extra).argmax(-1)
        attribution = _captum().IntegratedGradients(forward).attribute(
            pixels, baselines=torch.zeros_like(pixels), target=target, n_steps=steps,
            additional_forward_args=extra or None, internal_batch_size=steps,
        )  # fmt: skip
    return _per_patch(attribution, model, inputs, "sum")


@torch.no_grad()
def occlusion(
    model: torch.nn.Module, inputs: dict[str, torch.Tensor], target: torch.Tensor | None
) -> torch.Tensor:
    """captum's Occlusion, one patch at a time replaced by the zero input: the target logit's drop per patch,
    `(batch, num_patches)`."""
    forward, extra = _logit_function(model, inputs)
    pixels = inputs["pixel_values"]
    if target is None:
        target = forward(pixels, *extra).argmax(-1)
    window = patch_window(pixels, tuple(model.config.patch_hw))  # one patch
    attribution = _captum().Occlusion(forward).attribute(
        pixels, sliding_window_shapes=window, strides=window, baselines=0.0, target=target,
        additional_forward_args=extra or None, perturbations_per_eval=16,
    )  # fmt: skip
    return _per_patch(attribution, model, inputs, "mean")


@torch.no_grad()
def rollout(
    model: torch.nn.Module, inputs: dict[str, torch.Tensor], target: torch.Tensor | None = None
) -> torch.Tensor:
    """The class-agnostic attention rollout (`target` is ignored): `(batch, num_patches)`."""
    out = model(**inputs, output_attentions=True)
    maps = attention_rollout(out.attentions, num_prefix_tokens=model.config.num_prefix_tokens)
    return _masked(maps, valid_patches(inputs))


_FUNCTIONS: dict[str, Callable[..., torch.Tensor]] = {
    "grad_rollout": gradient_rollout,
    "gradcam": grad_cam,
    "integrated_gradients": integrated_gradients,
    "occlusion": occlusion,
    "rollout": rollout,
}


def check_method(method: str, model: torch.nn.Module | None = None) -> str:
    """`method` if it is one of METHODS, its library is installed (captum's methods) and the model can support it,
    else a ValueError that says what to pass instead."""
    check_method_name(method)
    if method in CAPTUM_METHODS:
        _captum()
    if model is not None and not hasattr(getattr(model, "vit", None), "layers"):
        raise ValueError(
            f"--explain {method} needs a vit_ft classifier (ViTFTForImageClassification); "
            f"{type(model).__name__} is not one (an ONNX or OpenVINO export has no gradients or attention maps)."
        )
    return method


def explain(
    model: torch.nn.Module,
    inputs: Inputs,
    method: str,
    target: int | Sequence[int] | torch.Tensor | None = None,
) -> torch.Tensor:
    """`method`'s map for each image's `target` class (None: the predicted class, the highest logit), as
    `(batch, num_patches)` float32 on the CPU. `model` is a ViTFTForImageClassification in eval mode; `inputs`
    its pixel values or NaFlex batch, on any device (moved to the model's)."""
    check_method(method, model)
    device = next(model.parameters()).device
    given = _as_inputs(inputs, device)
    batch = given["pixel_values"].shape[0]
    target = check_target(target, model.config.num_labels, batch)
    return _FUNCTIONS[method](model, given, None if target is None else target.to(device))


__all__ = [
    "CAPTUM_METHODS",
    "CLASS_SPECIFIC",
    "METHODS",
    "check_method",
    "check_target",
    "explain",
    "grad_cam",
    "gradient_rollout",
    "integrated_gradients",
    "occlusion",
    "patch_grids",
    "rollout",
]
