"""vit_ft.reports."""
