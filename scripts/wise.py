#!/usr/bin/env python
"""WiSE-FT, the weights of a zero-shot model and its fine-tune interpolated: `vit-ft wise`
(vit_ft/commands/wise.py), kept as a script path.

python scripts/wise.py --zeroshot outputs/pets-zs --finetuned outputs/pets-ft --output_dir outputs/pets-wise
"""

from vit_ft.commands.wise import main

if __name__ == "__main__":
    main()
