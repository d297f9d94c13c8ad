# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The roles' files parsed and their templates compiled once per pytest worker, before its tests (rendering.py)."""

from __future__ import annotations

from ansible_collections.gpuops.k8s.tests.unit.roles import rendering


def pytest_collection_finish(session):
    rendering.warm()
