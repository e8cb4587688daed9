"""vit_ft.data.datasets."""
