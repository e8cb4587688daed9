"""The bounds on what an input may cost before anything runs: pixels per decoded image and patch tokens per image.

They live here, below every layer that uses them and free of torch and transformers, so that a command's `--help`
(whose defaults name them) answers without importing either.
"""

from __future__ import annotations

# Pillow's own default (PIL.Image.MAX_IMAGE_PIXELS): ~ a 9459 x 9459 image, 256 MiB as 8-bit RGBA.
DEFAULT_MAX_PIXELS = 89_478_485
# Patch tokens per image that the tools run without being told to: ViT-B/16 at 1024x1024. Attention's time and
# memory grow with the square of the tokens, so a typo (--image_size 4096: 65536 tokens) would run for minutes
# at many GB before anything fails. The fine-tune raises it with $VIT_FT_MAX_IMAGE_TOKENS, predict with --max_tokens.
MAX_IMAGE_TOKENS = 4096

__all__ = ["DEFAULT_MAX_PIXELS", "MAX_IMAGE_TOKENS"]
