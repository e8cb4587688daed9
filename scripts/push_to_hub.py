#!/usr/bin/env python
"""Push a fine-tune output folder to the Hugging Face Hub: `vit-ft push`
(vit_ft/commands/push.py), kept as a script path.

python scripts/push_to_hub.py OUTPUT_DIR --hub_model_id me/vit-dogs                      # plain ViT where it is one
python scripts/push_to_hub.py OUTPUT_DIR --hub_model_id me/vit-dogs --format vit_ft      # vit-ft's code (remote code)
python scripts/push_to_hub.py OUTPUT_DIR --hub_model_id me/vit-dogs --local_dir staged   # look, don't push
"""

from vit_ft.commands.push import main

if __name__ == "__main__":
    main()
