# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""containerd's imports and drop-in files: what the main config imports and what a drop-in must carry (private).

A drop-in is edited with the same ``edit_containerd`` as a main file; this file answers the questions
around it. Where does it go (``drop_in_default``), does the main config read it (``covers``,
``ensure_import``), which imported files would undo an edit of the main file (``imports_overriding_cri``),
and what a new drop-in starts from (``drop_in_base``, ``effective_runc``): containerd 1.x replaces a whole
plugin section with an imported file's, containerd 2.x merges imported files key by key.
"""

from __future__ import annotations

import fnmatch
import glob
import os

from ansible_collections.gpuops.k8s.plugins.module_utils import _toml_text as tt
from ansible_collections.gpuops.k8s.plugins.module_utils._runtime_config import ConfigError, TomlEdit, plain_at
from ansible_collections.gpuops.k8s.plugins.module_utils._runtime_containerd_base import CRI_PLUGIN, cri_parts

DROP_IN_PATH = "/etc/containerd/conf.d/99-nvidia.toml"


def _import_paths(imports, config_path):
    """The import patterns of a main config, relative ones taken from its directory."""
    base = os.path.dirname(os.path.abspath(config_path))
    for pattern in imports if isinstance(imports, list) else []:
        if isinstance(pattern, str):
            yield pattern if os.path.isabs(pattern) else os.path.join(base, pattern)


def _imported_files(imports, config_path, skip=()):
    """(path, parsed data) of each file ``imports`` names, in containerd's order, the paths in ``skip`` left out.

    A file that cannot be read or parsed is passed over: containerd reports it itself.
    """
    skipped = {os.path.abspath(path) for path in skip if path}
    for pattern in _import_paths(imports, config_path):
        for imported in sorted(glob.glob(pattern)):
            if os.path.abspath(imported) in skipped:
                continue
            try:
                with open(imported, encoding="utf-8") as handle:
                    data = tt.loads(handle.read())
            except (OSError, ValueError, tt.TomlTextError):
                continue
            yield imported, data


def imports_overriding_cri(imports, config_version, config_path):
    """Imported files that define the version 2 CRI plugin section themselves.

    containerd 1.x merges an imported file's plugin sections over the main file's by replacing each
    whole section, so a runtime added to the main file has no effect when an import also carries
    ``plugins."io.containerd.grpc.v1.cri"``. (containerd 2.x merges them key by key.)
    """
    if config_version != 2:
        return []
    found = []
    for imported, data in _imported_files(imports, config_path, skip=(config_path,)):
        plugins = data.get("plugins")
        if isinstance(plugins, dict) and CRI_PLUGIN[2] in plugins:
            found.append(imported)
    return found


def imports_directory(imports, config_path):
    """True when the main config imports a drop-in directory (a glob such as ``conf.d/*.toml``)."""
    return any(glob.has_magic(pattern) for pattern in _import_paths(imports, config_path))


def drop_in_default(imports, config_path):
    """Where a drop-in goes by default: into the directory the main config imports, else DROP_IN_PATH."""
    for pattern in _import_paths(imports, config_path):
        if glob.has_magic(pattern) and not glob.has_magic(os.path.dirname(pattern)):
            return os.path.join(os.path.dirname(pattern), os.path.basename(DROP_IN_PATH))
    return DROP_IN_PATH


def covers(imports, config_path, drop_in_path):
    """True when one of the main config's imports names ``drop_in_path`` (literally or by a glob)."""
    target = os.path.abspath(drop_in_path)
    return any(fnmatch.fnmatch(target, os.path.abspath(p)) for p in _import_paths(imports, config_path))


def drop_in_import(drop_in_path):
    """What the main config imports for a drop-in: its directory's ``*.toml``, as nvidia-ctk does."""
    return os.path.join(os.path.dirname(drop_in_path), "*.toml")


def ensure_import(main_text, source, pattern):
    """The main config with ``pattern`` in its top-level ``imports`` list (nothing else changes)."""
    edit = TomlEdit(main_text, source)
    imports = edit.value(("imports",))
    if imports is not None and not isinstance(imports, list):
        raise ConfigError(f"{source}: imports must be a list of paths.")
    if imports and pattern in imports:
        return main_text, False
    new = [*(imports or []), pattern]
    statement = edit.doc.keyval(("imports",))
    if statement is not None:
        edit.set_key(("imports",), new)
    else:
        # A top-level key goes before the first table header, after the version line if there is one.
        doc = edit.doc
        version = doc.keyval(("version",))
        first_header = next((s for s in doc.statements if s.kind != "keyval"), None)
        if version is not None and (first_header is None or version.start < first_header.start):
            at = version.end
        elif first_header is not None:
            at = first_header.start
        else:
            at = len(doc.text)
        doc.insert_lines(at, [f"imports = {tt.value_text(new)}"])
        edit.after["imports"] = new
    return edit.finish()


def effective_cri_v2(main_data, config_path, exclude=None):
    """The version 2 CRI section containerd 1.x runs with: the main file's, or the last import's that has one.

    containerd 1.x reads the imports in order and each file that carries the CRI plugin section
    replaces the whole section; ``exclude`` (our own drop-in) is left out.
    """
    section = plain_at(main_data, ("plugins", CRI_PLUGIN[2]))
    for _path, data in _imported_files(main_data.get("imports"), config_path, skip=(exclude,)):
        found = plain_at(data, ("plugins", CRI_PLUGIN[2]))
        if isinstance(found, dict):
            section = found
    return section if isinstance(section, dict) else {}


def _deep_merge(base, over):
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def effective_runc(main_data, version, config_path, exclude=None):
    """runc's entry as containerd 2.x merges it, key by key, from the main file and the other imported files."""
    parts = (*cri_parts(version), "runtimes", "runc")
    runc = plain_at(main_data, parts)
    runc = runc if isinstance(runc, dict) else {}
    for _path, data in _imported_files(main_data.get("imports"), config_path, skip=(config_path, exclude)):
        found = plain_at(data, parts)
        if isinstance(found, dict):
            runc = _deep_merge(runc, found)
    return runc


def drop_in_base(main_data, version, config_path="/etc/containerd/config.toml", drop_in_path=None):
    """What a drop-in starts from: its version and, for version 2, the CRI section containerd runs with.

    containerd 1.x replaces a whole plugin section with an imported file's, so a version 2 drop-in
    that holds only the runtime would take every other CRI setting away (the sandbox image, runc's
    SystemdCgroup, registries). It therefore carries the CRI section as containerd 1.x would have
    run with it (the main file's, or an earlier import's), as nvidia-ctk's drop-ins do; containerd
    2.x merges key by key and needs none of it.
    """
    lines = [f"version = {version}"]
    if version == 2:
        cri = effective_cri_v2(main_data, config_path, drop_in_path)
        if cri:
            lines.append("")
            lines.extend(_table_text(("plugins", CRI_PLUGIN[2]), cri))
    return "\n".join(lines) + "\n"


def _table_text(parts, table):
    """A table as header sections (sub-tables as their own sections), for a file we write whole."""
    scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in table.items() if isinstance(v, dict)}
    lines = []
    if scalars or not tables:
        lines.append(f"[{tt.dotted(parts)}]")
        lines.extend(f"  {tt.key_text(k)} = {tt.value_text(v)}" for k, v in scalars.items())
        lines.append("")
    for key, value in tables.items():
        lines.extend(_table_text((*parts, key), value))
    return lines
