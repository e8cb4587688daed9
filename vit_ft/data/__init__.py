"""The data layer: images (decoding, crops), transforms and the collator, splits from Hub datasets and image
folders, bad-image screening, the built-in digits data. Imports only vit_ft.utils (pyproject's import-linter
contracts)."""
