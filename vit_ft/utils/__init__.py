"""vit_ft.utils."""
