"""The built-in recipes: the repository's recipes/ folder, installed as the data package vit_ft.recipes
(pyproject.toml maps it) and read through importlib.resources by vit_ft.arguments.recipes."""
