#!/usr/bin/env python
"""Pictures of what a ViT learned (the ViT paper's Figure 7), plus attention rollout: `vit-ft inspect`
(vit_ft/commands/inspect.py), kept as a script path.

python scripts/inspect_model.py --model outputs/digits --output_dir figures/digits
python scripts/inspect_model.py --model outputs/dogs --output_dir figures/dogs --images dog1.jpg dog2.jpg --num_images 64
"""

from vit_ft.commands.inspect import main

if __name__ == "__main__":
    main()
