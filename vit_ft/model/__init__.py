"""vit_ft.model."""
