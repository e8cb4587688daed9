"""vit_ft.tools."""
