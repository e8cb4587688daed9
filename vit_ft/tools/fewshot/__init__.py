"""Few-shot linear evaluation of a checkpoint's frozen features, as in the ViT paper (arXiv 2010.11929, §4.1).

One module per job: the least-squares probe (`probe`, pure numpy), which training images (`sampling`), the
images (`data`), the frozen features (`features`), and `run_fewshot`, which puts them together (`run`); the
report is `vit_ft.reports.fewshot`, the command `vit_ft.commands.fewshot`.
"""

from .data import FewShotSource
from .run import DEFAULT_SHOTS, FewShotOptions, run_fewshot

__all__ = ["DEFAULT_SHOTS", "FewShotOptions", "FewShotSource", "run_fewshot"]
