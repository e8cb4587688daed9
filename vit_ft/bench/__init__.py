"""`vit-ft bench SUITE`: the VTAB-1k / FGVC harness that ranks the fine-tuning methods (a grid of ordinary
fine-tunes under the paper protocol, one table beside the published rows). A layer above `training`: it runs
the fine-tune's stages, which know nothing of it."""
