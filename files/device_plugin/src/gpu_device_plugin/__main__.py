"""`python -m gpu_device_plugin`."""

from __future__ import annotations

import sys

from gpu_device_plugin.cli import main

if __name__ == "__main__":
    sys.exit(main())
