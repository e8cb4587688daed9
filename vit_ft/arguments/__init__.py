"""The fine-tune's arguments in three rooms, below both the training and the tools that read a recipe: the recipe
(`recipes`: finding and reading YAML recipes, each value converted as its flag, the did-you-mean, `parse_args`),
the argument dataclasses (`fields`: ModelArguments, DataArguments; `training_arguments`, `augmentation_arguments`)
and the merge they are built from (`merge`, `data_loading`, `global_batch`), and the checks (`ranges`, each number
when its dataclass is built; `checks.validate`, across them, run once)."""
