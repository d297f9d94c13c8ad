#!/usr/bin/env python
"""Prints the lower bound of every dependency pyproject.toml declares, one `name==version` per line.

These are the versions the daemon is tested with: python39-env.sh installs them on Python 3.9 and
build-image.sh puts them into the image, so both are reproducible whatever the newest releases are.
A dependency without a lower bound (`==X` or `>=X`) is an error."""

from __future__ import annotations

import os
import re
import sys

try:
    import tomllib
except ImportError:  # Python < 3.11
    import tomli as tomllib

PYPROJECT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pyproject.toml")
_REQUIREMENT = re.compile(r"([A-Za-z0-9._-]+)\s*(?:==|>=)\s*([^,;\s]+)\s*(?:,.*)?")


def lower_bounds(path: str = PYPROJECT) -> dict[str, str]:
    with open(path, "rb") as handle:
        dependencies = tomllib.load(handle)["project"]["dependencies"]
    bounds = {}
    for dependency in dependencies:
        match = _REQUIREMENT.fullmatch(dependency)
        if not match:
            raise ValueError(f"{path}: the dependency {dependency!r} has no lower bound (==X or >=X).")
        bounds[match.group(1)] = match.group(2)
    return bounds


if __name__ == "__main__":
    try:
        print("\n".join(f"{name}=={version}" for name, version in lower_bounds().items()))
    except ValueError as error:
        sys.exit(str(error))
