"""scripts/ holds evaluate.py and inspect.py, the names of the `evaluate` library and of the standard library's
`inspect`. `python scripts/<any script>.py` puts scripts/ first on sys.path, so an `import evaluate` or
`import inspect` anywhere (vit_ft.metrics, torch, dataclasses, ...) lands on our script; `load_library` puts the
real module in its place, and `without_scripts_dir` takes scripts/ off the path for the script's own run."""

import importlib.machinery
import importlib.util
import os
import sys

SCRIPTS_DIR = os.path.dirname(os.path.realpath(__file__))


def without_scripts_dir(paths: list[str]) -> list[str]:
    return [p for p in paths if os.path.realpath(p or os.curdir) != SCRIPTS_DIR]


def load_library(name: str) -> None:
    """Execute the real module `name` found outside scripts/ and register it; the importer returns it."""
    spec = importlib.machinery.PathFinder.find_spec(name, without_scripts_dir(sys.path))
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"No module named {name!r} outside {SCRIPTS_DIR}.", name=name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
