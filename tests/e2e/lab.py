#!/usr/bin/env python
"""The end-to-end lab's command line: ``tests/e2e/lab.py COMMAND [ARGS...]`` (see gpuops_lab.cli)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpuops_lab.cli import main

if __name__ == "__main__":
    sys.exit(main())
