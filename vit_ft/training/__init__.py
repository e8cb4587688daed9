"""vit_ft.training.stages."""
