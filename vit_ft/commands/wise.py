"""WiSE-FT: interpolate the weights of a zero-shot model and its fine-tune into one model (Wortsman et al. 2022).

vit-ft wise --zeroshot outputs/pets-zs --finetuned outputs/pets-ft --output_dir outputs/pets-wise
vit-ft wise --zeroshot outputs/pets-zs --finetuned outputs/pets-ft --output_dir outputs/pets-wise --alpha 0.5
vit-ft wise ... --shift corruptions        # the curve's shifted accuracy too (or --shift FOLDER)

The zero-shot model is a `vit-ft finetune --method zeroshot` output, the fine-tune one started from it
(`--head_init zeroshot`, same checkpoint): both of the same shapes and labels. Without --alpha, the alpha of best
validation accuracy over the grid 0, 0.1, ..., 1 (the fine-tune's recorded validation split, or --recipe's, or
--data_dir) is kept. Writes an ordinary model folder (predict, evaluate, export and the demo read it) with
wise.json, wise.csv / wise.md and wise.png (validation and shifted accuracy over alpha).
"""

from __future__ import annotations

import argparse
from typing import Any

from ..utils.cli import ToolArgumentParser, run_tool


def _alphas(text: str) -> list[float]:
    try:
        return [float(value) for value in text.split(",") if value.strip()]
    except ValueError as error:
        raise ValueError(f"--alphas {text!r} is not a comma-separated list of numbers, e.g. 0,0.25,0.5,0.75,1.") from error


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = ToolArgumentParser(__doc__)
    parser.add_argument("--zeroshot", required=True, help="The zero-shot model (alpha 0): folder or Hub id.")
    parser.add_argument("--finetuned", required=True, help="Its fine-tune (alpha 1): folder or Hub id.")
    parser.add_argument("--output_dir", required=True, help="Folder for the interpolated model and its curve.")
    parser.add_argument("--alpha", type=float, help="The fine-tune's weight in [0, 1] (default: chosen on validation).")
    parser.add_argument("--alphas", type=_alphas, default=None, help="The curve's grid (default 0,0.1,...,1).")
    parser.add_argument("--recipe", help="Choose alpha on this recipe's validation split.")
    parser.add_argument("--data_dir", help="Choose alpha on this folder of class folders.")
    parser.add_argument("--shift", metavar="corruptions|FOLDER|HUB_ID", help="The curve's shifted accuracy: "
                        "'corruptions' (ImageNet-C's, on the validation images), a folder of class folders or a Hub "
                        "dataset id (ID@REVISION pins one).")  # fmt: skip
    parser.add_argument("--seed", type=int, help="Data seed (default: the fine-tune's).")
    parser.add_argument("--max_samples", type=int, help="A seeded subset of this many validation images.")
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--device", help="cuda, cpu, ... (default: cuda when available).")
    parser.add_argument("--overwrite", action="store_true", help="Replace files of the output's names not written by wise.")
    return parser.parse_args(argv)


def wise(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse the flags and run `vit_ft.tools.wise.run_wise`; returns wise.json's contents."""
    args = parse_args(argv)
    from ..utils.logs import setup_logging
    from .model_flags import check_model

    for flag in ("zeroshot", "finetuned"):
        check_model(getattr(args, flag), flag=f"--{flag}")
    setup_logging()
    from ..tools.wise import ALPHAS, run_wise

    values = vars(args)
    values["alphas"] = values["alphas"] or ALPHAS
    return run_wise(**values)


def main(argv: list[str] | None = None) -> None:
    """`vit-ft wise ARGS`: exits 0, or 1 with one `error:` line."""
    run_tool(wise, argv)


if __name__ == "__main__":
    main()
