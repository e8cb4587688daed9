"""The formats a push shares a model in, free of torch and transformers so that `push --help` names them at once:
"transformers" (its own class, no remote code), "vit_ft" (our code, trust_remote_code) or "auto" (transformers'
class wherever the model is exactly one; `hub_format.choose_format` decides)."""

from __future__ import annotations

AUTO = "auto"
FORMATS = ("vit_ft", "transformers")
FORMAT_CHOICES = (AUTO, *FORMATS)

__all__ = ["AUTO", "FORMATS", "FORMAT_CHOICES"]
