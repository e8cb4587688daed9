"""vit-ft evaluate: which images (`data`), the model's outputs on them (`outputs`), the files (`run`)."""
