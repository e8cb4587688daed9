"""docs/architecture.md's module table is true: every module of every vit_ft package is in its package's rows, and
every module a row names exists (a sub-package is named as `name/`)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "vit_ft"


def documented_modules() -> dict[str, set[str]]:
    """{package: names in its rows of the table}: `module.py` or `subpackage/`, as the rows write them."""
    rows: dict[str, set[str]] = {}
    package = None
    for line in (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.split("|")[1:-1]]
        if len(cells) < 3:
            continue
        named = re.fullmatch(r"`vit_ft/([\w/]+)/`", cells[0])
        if named:
            package = named.group(1)
        elif cells[0]:
            package = None  # a row outside the package (scripts/, recipes/, ...)
        if package is not None:
            names = re.findall(r"`([\w.]+\.py|\w+/)`", cells[1])
            rows.setdefault(package, set()).update(names)
    return rows


def package_modules() -> dict[str, set[str]]:
    """{package (e.g. "tools", "tools/evaluate"): its modules (`x.py`) and sub-packages (`name/`)}, for every
    package below vit_ft/ (metrics/classification/ is the local `evaluate` module's folder, not a package)."""
    found: dict[str, set[str]] = {}
    for init in sorted(PACKAGE.rglob("__init__.py")):
        package = init.parent
        if package == PACKAGE:
            continue
        names = {
            f"{p.name}/"
            for p in package.iterdir()
            if (p / "__init__.py").is_file() or p.name == "classification"
        }
        names |= {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
        found[package.relative_to(PACKAGE).as_posix()] = names
    return found


def test_every_module_is_in_the_table():
    documented = documented_modules()
    missing = {
        package: sorted(names - documented.get(package, set()))
        for package, names in package_modules().items()
        if names - documented.get(package, set())
    }
    assert not missing, f"docs/architecture.md's table lacks {missing}"


def test_every_module_in_the_table_exists():
    stale = {
        package: sorted(name for name in names if not (PACKAGE / package / name.rstrip("/")).exists())
        for package, names in documented_modules().items()
    }
    assert not any(stale.values()), f"docs/architecture.md names modules that do not exist: {stale}"


MAX_MODULE_LINES, MAX_FUNCTION_LINES = 400, 60  # the floor plan's sizes (docs/architecture.md)


def test_every_module_and_function_keeps_the_floor_plans_size():
    """No module of vit_ft/, scripts/ or benchmarks/ over 400 lines, no function over 60 (decorators aside)."""
    import ast

    too_long = []
    for path in sorted(p for folder in ("vit_ft", "scripts", "benchmarks") for p in (ROOT / folder).rglob("*.py")):
        source, name = path.read_text(encoding="utf-8"), path.relative_to(ROOT).as_posix()
        if source.count("\n") > MAX_MODULE_LINES:
            too_long.append(f"{name}: {source.count(chr(10))} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}:{node.lineno} {node.name}: {lines} lines")
    assert not too_long, f"over the floor plan's {MAX_MODULE_LINES} / {MAX_FUNCTION_LINES} lines: {too_long}"
