"""vit-ft predict: image files -> rows (`run`), the rows' files and the rule that keeps a user's files safe (`output`)."""
