#!/usr/bin/env python
"""Export a trained model to ONNX (and int8): `vit-ft export` (vit_ft/commands/export.py), kept as a script path.

python scripts/export.py --model outputs/digits --output_dir outputs/digits-onnx --quantize int8
"""

from vit_ft.commands.export import main

if __name__ == "__main__":
    main()
