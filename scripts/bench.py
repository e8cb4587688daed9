#!/usr/bin/env python
"""Benchmark vit_ft against transformers' ViT on this machine; writes a Markdown table and JSON.

python scripts/bench.py                                  # ViT-B/16 at 224 px, all sections (minutes)
python scripts/bench.py --quick                          # a tiny ViT, seconds
python scripts/bench.py --sections model,ceiling --dtypes bf16 --rounds 9
python scripts/bench.py --threads 2 --output-dir outputs/benchmark
python scripts/bench.py --sections gpu                   # on a GPU: ViT-B/16 at 384 px, bf16, batch 64

Method and sections: see benchmarks/ (the package's docstring); the latest numbers and what they mean:
docs/benchmarks.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

# benchmarks/ sits at the repository root, not installed (pyproject installs vit_ft only): import it from here
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.run import main  # noqa: E402
from vit_ft.utils.cli import run_tool  # noqa: E402

if __name__ == "__main__":
    run_tool(main, description=__doc__)
