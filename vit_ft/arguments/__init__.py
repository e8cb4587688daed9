"""The fine-tune's arguments in three rooms, below both the training and the tools that read a recipe: the recipe
(`recipes`: finding and reading YAML recipes, each value converted as its flag, the did-you-mean, `parse_args`),
the argument dataclasses (`fields`: ModelArguments, DataArguments; `training_arguments`,
`augmentation_arguments`), and the checks across them (`checks.validate`), run once."""
