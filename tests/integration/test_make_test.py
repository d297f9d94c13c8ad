"""scripts/make-test.sh, the runner behind `make test`: its tier table, and a failure told at the very end of its
output, where a CI page that shows only the last lines still says which test failed and why."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A stand-in for make: each "tier" prints lines and exits as its name says.
FAKE_MAKE = """#!/bin/sh
tier=$2
i=0
while [ $i -lt 40 ]; do echo "$tier line $i"; i=$((i + 1)); done
case $tier in
  pytest-fails) echo "FAILED tests/test_x.py::test_y - AssertionError: the report was two reports"; exit 2 ;;
  script-fails) echo "the build stopped: no space left"; exit 2 ;;
esac
"""


def run(tmp_path: Path, *groups: str) -> subprocess.CompletedProcess[str]:
    make = tmp_path / "make"
    make.write_text(FAKE_MAKE, encoding="utf-8")
    make.chmod(make.stat().st_mode | stat.S_IXUSR)
    env = dict(os.environ, MAKE=str(make), GPUOPS_BUILD_EARLY="0", GPUOPS_TEST_FULL="0")
    return subprocess.run(
        ["scripts/make-test.sh", *groups], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_a_failed_tier_is_named_with_its_failures_after_the_table(tmp_path):
    result = run(tmp_path, "setup", "passes pytest-fails", "script-fails")
    assert result.returncode == 1
    out = result.stdout
    table = out.index("make test, minutes per tier:")
    tail = out[table:]
    assert "pytest-fails       1" in tail and "failed (2)" in tail
    # After the table: pytest's summary line for the tier pytest ran, the last lines of the other.
    told = tail.index("pytest-fails failed:")
    assert "FAILED tests/test_x.py::test_y - AssertionError: the report was two reports" in tail[told:]
    assert "pytest-fails line 39" not in tail[told:]
    other = tail.index("script-fails failed:")
    assert "the build stopped: no space left" in tail[other:]
    assert "script-fails line 29" in tail[other:] and "script-fails line 28" not in tail[other:]
    assert "passes failed:" not in tail
    assert out.rstrip().endswith("make test: a tier failed (above)")


def test_a_run_that_passes_says_so_and_names_no_failure(tmp_path):
    result = run(tmp_path, "setup", "passes", "passes-too")
    assert result.returncode == 0, result.stdout[-2000:]
    assert " failed:" not in result.stdout
    assert result.stdout.rstrip().endswith("make test: every tier passed")
