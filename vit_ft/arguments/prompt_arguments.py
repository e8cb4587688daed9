"""The keys of `method: vpt` (VPT, Jia et al. 2022: learned prompt tokens in the frozen model's token sequence,
`vit_ft.model.prompts`). `PromptArguments` is a base of `vit_ft.arguments.fields.ModelArguments`, so that its
fields are recipe keys and flags like the others; `check_prompt_keys` refuses them under another method."""

from __future__ import annotations

from dataclasses import dataclass

from .help import option

# the official repository's demo (KMnP/vpt, demo.ipynb: "VPT with p=50", shallow and deep); its paper tunes
# the length per task over {1, 5, 10, 50, 100, 200}; V-PETL Bench's VPT-shallow runs 100 (vit-ft bench's)
VPT_TOKENS = 50


@dataclass
class PromptArguments:
    """VPT's prompt tokens (method vpt)."""

    vpt_tokens: int | None = option(
        None,
        f"method vpt: the number of prompt tokens after the class (and register) tokens; unset: {VPT_TOKENS} "
        "(VPT's demo; its paper tunes 1-200 per task).",
    )
    vpt_deep: bool = option(
        False, "method vpt: a set of prompt tokens for every block (VPT-deep) instead of the first only (shallow)."
    )

    def check_prompt_keys(self, method: str) -> None:
        """The prompt keys belong to method vpt; under it, `vpt_tokens` unset takes its default."""
        given = [key for key in ("vpt_tokens", "vpt_deep") if getattr(self, key) not in (None, False)]
        if given and method != "vpt":
            raise ValueError(f"{', '.join(given)} set VPT's prompt tokens, not method: {method}; add --method vpt "
                             "or drop them.")  # fmt: skip
        if method == "vpt" and self.vpt_tokens is None:
            self.vpt_tokens = VPT_TOKENS


__all__ = ["VPT_TOKENS", "PromptArguments"]
