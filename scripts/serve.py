#!/usr/bin/env python
"""Serve a trained model over HTTP with dynamic batching: `vit-ft serve` (vit_ft/commands/serve.py), kept as a
script path.

python scripts/serve.py outputs/digits --port 8000 --max_batch 8
"""

from vit_ft.commands.serve import main

if __name__ == "__main__":
    main()
