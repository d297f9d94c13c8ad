# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The split module_utils keep one entrance each: callers import _toml_text and _runtime_containerd only.

Their docstrings say so, and docs/architecture.md lists the parts behind each entrance; a plugin that
imported a part directly would make the parts a second interface that nobody documents.
"""

from __future__ import annotations

import ast
import os

from ansible_collections.gpuops.k8s.plugins.module_utils import _runtime_containerd, _toml_text

PACKAGE = "ansible_collections.gpuops.k8s.plugins.module_utils"
PLUGINS = os.path.dirname(os.path.dirname(os.path.abspath(_toml_text.__file__)))

# Each part, and the only module_utils that may import it.
ALLOWED_IMPORTERS = {
    "_toml_values": {"_toml_scan", "_toml_text"},
    "_toml_scan": {"_toml_text"},
    "_runtime_containerd_base": {"_runtime_containerd", "_runtime_containerd_dropin", "_runtime_containerd_rancher"},
    "_runtime_containerd_dropin": {"_runtime_containerd"},
    "_runtime_containerd_rancher": {"_runtime_containerd"},
}


def _imported_module_utils(path):
    """The collection's module_utils a Python file imports (by their file names)."""
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read(), path)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == PACKAGE:
                found.update(alias.name for alias in node.names)
            elif node.module.startswith(PACKAGE + "."):
                found.add(node.module[len(PACKAGE) + 1 :])
        elif isinstance(node, ast.Import):
            found.update(a.name[len(PACKAGE) + 1 :] for a in node.names if a.name.startswith(PACKAGE + "."))
    return found


def test_parts_are_imported_through_their_entrance_only():
    wrong = []
    for directory, _dirs, files in os.walk(PLUGINS):
        for name in sorted(files):
            if not name.endswith(".py"):
                continue
            importer = os.path.splitext(name)[0]
            for part in _imported_module_utils(os.path.join(directory, name)):
                if part in ALLOWED_IMPORTERS and importer not in ALLOWED_IMPORTERS[part]:
                    wrong.append(f"{os.path.relpath(os.path.join(directory, name), PLUGINS)} imports {part}")
    assert not wrong, wrong


def test_each_entrance_names_what_it_promises():
    for module in (_toml_text, _runtime_containerd):
        missing = [name for name in module.__all__ if not hasattr(module, name)]
        assert not missing, (module.__name__, missing)
    # What nvidia_runtime.py and the other runtimes use from the entrances.
    assert {"Document", "TomlTextError", "dotted", "key_text", "loads", "scan", "value_text", "verify"} <= set(
        _toml_text.__all__
    )
    assert {"edit_containerd", "edit_template", "drop_in_base", "ensure_import", "generated_by"} <= set(
        _runtime_containerd.__all__
    )
