"""pyproject.toml as the tests see it: the installed top-level packages and the package-data globs.

Read with ``tomli`` (in the lock; ``tomllib`` is Python 3.11+)."""
from pathlib import Path

import tomli

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = REPO / "pyproject.toml"


def load_pyproject() -> dict:
    with open(PYPROJECT, "rb") as f:
        return tomli.load(f)


def package_includes() -> list:
    """``[tool.setuptools.packages.find] include``: package names and ``name.*`` patterns."""
    return load_pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]


def top_level_packages() -> set:
    """The top-level packages pyproject.toml installs (the includes without a dot)."""
    return {name for name in package_includes() if "." not in name}
