"""Fixtures of the AWX tier: the execution environment (scripts/build-ee.sh) and, for the jobs that
converge nodes, a lab of its own (tests/e2e/lab.py, instance GPUOPS_LAB_INSTANCE; `make test-awx` picks
1 so that it never meets the end-to-end tier's lab 0).

The lab fixture is the end-to-end tier's own (tests/e2e/conftest.py), loaded under another name."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

E2E = Path(__file__).resolve().parents[1] / "e2e"
sys.path.insert(0, str(E2E))

_spec = importlib.util.spec_from_file_location("gpuops_e2e_conftest", E2E / "conftest.py")
assert _spec is not None and _spec.loader is not None
e2e = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = e2e
_spec.loader.exec_module(e2e)

# The end-to-end tier's session fixture: the lab up for the session, down afterwards.
lab = e2e.lab


@pytest.fixture(scope="session")
def ee_image() -> str:
    from runner_job import build_ee

    return build_ee()
