#!/usr/bin/env python
"""A data audit (label issues, duplicates, leaks, outliers) with a model's frozen features: `vit-ft audit`
(vit_ft/commands/audit.py), kept as a script path.

python scripts/audit.py --model outputs/digits-pretrained --dataset data/digits --output_dir reports/audit
"""

from vit_ft.commands.audit import main

if __name__ == "__main__":
    main()
