"""CPU kernels for the ViT's products, applied to a built model from outside by one call: `kernelize(model)`.

The model file is plain PyTorch + transformers (`nn.Linear`, transformers' attention registry), so a saved folder
loads without this package; `kernelize` then swaps in, without copying a parameter:
- `onednn_linear.Linear` for every `nn.Linear` (same parameters and state-dict keys, still an `nn.Linear`);
- an MLP whose first product has the exact GELU fused in (`onednn_linear.linear_activation`);
- the "vit_ft_sdpa" attention function (`onednn_attention.sdpa_attention_forward`): transformers' SDPA, with bf16
  on CPU as batched oneDNN products. It is registered in transformers' attention registry under its own name,
  so transformers' own models keep their "sdpa".
It is what transformers' `kernelize` / `use_kernel_forward_from_hub` do for hub kernels. Each kernel decides at
each call, by the switch (`switch.kernels_enabled`: `VIT_FT_KERNELS`, the CPU vendor, tracing), whether its
oneDNN path runs, its bf16 path only where the CPU has native bf16 products (`utils.hardware.onednn_bf16_supported`),
and otherwise runs the plain torch computation. LoRA's input dropout is `PackedBitsDropout`.
"""

from __future__ import annotations

import functools

from torch import nn
from transformers import AttentionInterface

from .dropout import PackedBitsDropout
from .onednn_attention import sdpa_attention_forward
from .onednn_linear import Linear, linear, linear_activation
from .switch import KERNELS_ENV, kernels_enabled

# the attention implementation kernelize sets where the model had transformers' "sdpa"
ATTENTION_IMPLEMENTATION = "vit_ft_sdpa"
AttentionInterface.register(ATTENTION_IMPLEMENTATION, sdpa_attention_forward)


def _fused_gelu_forward(self, hidden_states):
    """The MLP's `fc2(act(fc1(x)))` with the exact GELU fused into fc1's product where fc1 is our own `Linear`
    (not a peft wrapper, whose adapter must see the call)."""
    return self.fc2(linear_activation(self.fc1, hidden_states, "gelu", self.activation_fn))


@functools.cache
def _fused_mlp_class(cls: type[nn.Module]) -> type[nn.Module]:
    """A subclass of the MLP class `cls` with the fused forward (same name, parameters and state-dict keys)."""
    return type(cls.__name__, (cls,), {"forward": _fused_gelu_forward, "__qualname__": cls.__qualname__})


def _is_gelu_mlp(module: nn.Module) -> bool:
    """An MLP `fc2(activation_fn(fc1(x)))` with transformers' exact GELU (`config.hidden_act == "gelu"`)."""
    config = getattr(module, "config", None)
    return (
        all(isinstance(getattr(module, name, None), nn.Linear) for name in ("fc1", "fc2"))
        and hasattr(module, "activation_fn")
        and getattr(config, "hidden_act", None) == "gelu"
    )


def kernelize(model: nn.Module) -> nn.Module:
    """Swap the CPU kernels into a built vit_ft model, in place, and return it.

    Only the modules' classes change (no parameter is copied or moved), so call it on the model before peft wraps
    it: LoRA's adapters then sit on our `Linear` layers, as they would on `nn.Linear`. Calling it twice changes
    nothing more. Where `VIT_FT_KERNELS` or the CPU rules the kernels out, each kernel runs the plain torch call.
    """
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = Linear
        elif _is_gelu_mlp(module) and type(module).forward is not _fused_gelu_forward:
            module.__class__ = _fused_mlp_class(type(module))
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) == "sdpa" and hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(ATTENTION_IMPLEMENTATION)
    return model


__all__ = [
    "ATTENTION_IMPLEMENTATION",
    "KERNELS_ENV",
    "Linear",
    "PackedBitsDropout",
    "kernelize",
    "kernels_enabled",
    "linear",
    "linear_activation",
    "sdpa_attention_forward",
]
