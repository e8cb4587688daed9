#!/usr/bin/env python
"""One fine-tune under several seeds: `vit-ft seeds` (vit_ft/commands/seeds.py).

python scripts/seeds.py --recipe digits --seeds 0,1,2 --output_dir outputs/digits-seeds
"""

from vit_ft.commands.seeds import main

if __name__ == "__main__":
    main()
