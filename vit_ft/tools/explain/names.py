"""The explanation methods' names, light enough for the command's flag check (no torch)."""

from __future__ import annotations

METHODS = ("grad_rollout", "gradcam", "integrated_gradients", "occlusion", "rollout")
CLASS_SPECIFIC = ("grad_rollout", "gradcam", "integrated_gradients", "occlusion")
CAPTUM_METHODS = ("integrated_gradients", "occlusion")  # from captum: the `explain` extra
# `vit-ft evaluate --explain`'s default: the cheapest class-specific map (about one forward + backward, docs/tools.md)
REPORT_METHOD = "gradcam"


def check_method_name(method: str) -> str:
    """`method` if it is one of METHODS, else a ValueError naming them."""
    if method not in METHODS:
        raise ValueError(f"--explain {method!r} is not a method: choose one of {', '.join(METHODS)}.")
    return method


__all__ = ["CAPTUM_METHODS", "CLASS_SPECIFIC", "METHODS", "REPORT_METHOD", "check_method_name"]
