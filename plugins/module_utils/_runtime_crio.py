# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""CRI-O's rules for the nvidia runtime: a drop-in with ``[crio.runtime.runtimes.<name>]`` (private).

CRI-O reads ``crio.conf``, then every file under ``crio.conf.d`` in lexical order (whatever the name ends
in: ``99-nvidia.conf`` of nvidia-ctk counts as much as our ``99-nvidia.toml``), each over what the files
before it set: a key a later file sets wins, and a runtime table a later file has replaces that runtime's
whole entry. The edit of one file therefore looks at the others: ``before`` (read earlier) and ``after``
(read later), as (path, parsed data) pairs.
"""

from __future__ import annotations

import json

from ansible_collections.gpuops.k8s.plugins.module_utils import _toml_text as tt
from ansible_collections.gpuops.k8s.plugins.module_utils._runtime_config import (
    NVIDIA_VARIANTS,
    ConfigError,
    EditResult,
    TomlEdit,
    adoption_error,
    cdi_dirs,
    comment_without_marker,
    foreign_entry_error,
    is_nvidia_binary,
    marker_comment,
    plain_at,
    read_marker,
    variant_binary,
)

PARTS = ("crio", "runtime")


def _check(entry, entry_parts, source, wanted, runtime_path, adopt_existing):
    """'ours', 'adopt' or raise: what an existing entry of that name is."""
    if not isinstance(entry, dict):
        raise ConfigError(
            f"{source}: {tt.dotted(entry_parts)} is a {type(entry).__name__}, but a table was expected there."
        )
    runtime_type = entry.get("runtime_type")
    path = entry.get("runtime_path")
    if runtime_type not in (None, "", "oci"):
        raise foreign_entry_error(
            source,
            tt.dotted(entry_parts),
            f"runtime_type {json.dumps(runtime_type)} and runtime_path {json.dumps(path)}",
            runtime_path,
        )
    if path in (None, "", wanted):
        return "ours"
    if not is_nvidia_binary(path, runtime_path):
        raise foreign_entry_error(
            source,
            tt.dotted(entry_parts),
            f"runtime_type {json.dumps(runtime_type)} and runtime_path {json.dumps(path)}",
            runtime_path,
        )
    if not adopt_existing:
        raise adoption_error(source, tt.dotted(entry_parts), path, wanted)
    return "adopt"


def edit_crio(
    text,
    source,
    name,
    runtime_path,
    set_as_default,
    state,
    adopt_existing=True,
    enable_cdi=False,
    cdi_spec_dirs=None,
    before=(),
    after=(),
):
    """Add (or remove) the nvidia runtime in a CRI-O config file or drop-in, given the files CRI-O reads around it."""
    edit = TomlEdit(text, source)
    inherited = _merged(before)
    for depth in (1, 2):
        value = edit.value(PARTS[:depth])
        if value is not None and not isinstance(value, dict):
            raise ConfigError(
                f"{source}: {tt.dotted(PARTS[:depth])} is a {type(value).__name__}, but a table was expected there."
            )
    adopted = []
    notes = []
    if state == "present":
        _present(edit, inherited[0], name, runtime_path, set_as_default, adopt_existing, adopted)
        if enable_cdi and edit.value((*PARTS, "cdi_spec_dirs")) != cdi_dirs(cdi_spec_dirs):
            edit.set_key((*PARTS, "cdi_spec_dirs"), cdi_dirs(cdi_spec_dirs))
    else:
        _absent(edit, inherited[0], name, runtime_path, notes)
    new_text, changed = edit.finish()
    entry, default = _as_crio_reads_it(edit, inherited, _merged(after), name, set_as_default, state, notes)
    return EditResult(new_text, changed, entry, default, adopted=adopted, notes=notes)


def _present(edit, inherited_runtimes, name, runtime_path, set_as_default, adopt_existing, adopted):
    """The nvidia entry (and variants other installers left) pointed at our binaries, and the default runtime."""
    runtimes_parts = (*PARTS, "runtimes")
    for variant in NVIDIA_VARIANTS:
        key = name + variant
        parts = (*runtimes_parts, key)
        entry = edit.value(parts)
        if entry is None and key in inherited_runtimes:
            _take_over(edit, parts, inherited_runtimes[key], variant, runtime_path, adopt_existing, adopted)
            continue
        if entry is None:
            continue
        wanted = variant_binary(runtime_path, variant)
        if variant and not (isinstance(entry, dict) and is_nvidia_binary(entry.get("runtime_path"), runtime_path)):
            continue
        verdict = _check(entry, parts, edit.source, wanted, runtime_path, adopt_existing)
        if verdict == "adopt":
            adopted.append({"entry": tt.dotted(parts), "from": entry.get("runtime_path"), "to": wanted})
        if entry.get("runtime_path") != wanted:
            edit.set_key((*parts, "runtime_path"), wanted)
        if not variant and entry.get("runtime_type") != "oci":
            edit.set_key((*parts, "runtime_type"), "oci")
    if edit.value((*runtimes_parts, name)) is None:
        edit.add_table((*runtimes_parts, name), {"runtime_path": runtime_path, "runtime_type": "oci"})
    default_parts = (*PARTS, "default_runtime")
    current = edit.value(default_parts)
    # Set here even where an earlier file (nvidia-ctk's) says the same: the drop-in stands on its own when
    # that file goes, and absent removing it gives the earlier files' default back.
    if set_as_default and current != name:
        user_comment = comment_without_marker(edit.comment(default_parts)) if current is not None else ""
        marker = marker_comment(current, table_added=not edit.defined(PARTS))
        edit.set_key(default_parts, name, comment=f"{user_comment} # {marker}" if user_comment else marker)


def _absent(edit, inherited_runtimes, name, runtime_path, notes):
    """The nvidia entry gone (refused when it runs another binary), and the default runtime given back."""
    runtimes_parts = (*PARTS, "runtimes")
    entry_parts = (*runtimes_parts, name)
    default_parts = (*PARTS, "default_runtime")
    entry = edit.value(entry_parts)
    if entry is not None:
        _check(entry, entry_parts, edit.source, runtime_path, runtime_path, True)
        edit.remove(entry_parts)
    if edit.value(default_parts) == name:
        found, previous, table_added = read_marker(edit.comment(default_parts))
        if found and previous is not None:
            edit.set_key(default_parts, previous, comment=comment_without_marker(edit.comment(default_parts)))
        else:
            edit.remove(default_parts)
            if table_added:
                edit.drop_empty_header(PARTS)
    edit.prune_empty(runtimes_parts)
    if name in inherited_runtimes:
        where = inherited_runtimes[name][1]
        notes.append(
            f"{where} still defines the runtime {name} ({tt.dotted(entry_parts)}), and CRI-O keeps reading it; "
            "remove it there if it should go too."
        )


def _as_crio_reads_it(edit, inherited, later, name, set_as_default, state, notes):
    """(entry, default runtime) as CRI-O has them after every file; a later file that overrides us is a note."""
    inherited_runtimes, inherited_default = inherited
    later_runtimes, later_default = later
    entry_parts = (*PARTS, "runtimes", name)
    default_parts = (*PARTS, "default_runtime")
    entry = edit.value(entry_parts)
    if entry is None and name in inherited_runtimes:
        entry = inherited_runtimes[name][0]
    default = edit.value(default_parts)
    if default is None:
        default = inherited_default[0]
    if name in later_runtimes and state == "present":
        entry = later_runtimes[name][0]
        notes.append(
            f"{later_runtimes[name][1]} is read after {edit.source} and defines {tt.dotted(entry_parts)} again, which "
            "replaces the whole entry written here; remove it there or give this file a name that sorts later."
        )
    if later_default[1] is not None:
        if later_default[0] != default and (set_as_default or state == "absent"):
            notes.append(
                f"{later_default[1]} is read after {edit.source} and sets {tt.dotted(default_parts)} = "
                f"{json.dumps(later_default[0])}, which CRI-O uses instead of the default runtime written here."
            )
        default = later_default[0]
    return entry, default


def _merged(files):
    """(runtimes {name: (entry, path)}, (default_runtime, path)) as CRI-O has them after reading ``files``."""
    runtimes, default = {}, (None, None)
    for path, data in files:
        listed = plain_at(data, ("crio", "runtime", "runtimes"))
        if isinstance(listed, dict):
            for key, entry in listed.items():
                runtimes[key] = (entry, path)
        value = plain_at(data, ("crio", "runtime", "default_runtime"))
        if value is not None:
            default = (value, path)
    return runtimes, default


def _take_over(edit, parts, found, variant, runtime_path, adopt_existing, adopted):
    """An nvidia entry another file defines: written here with our binary (a table here replaces it whole)."""
    entry, where = found
    wanted = variant_binary(runtime_path, variant)
    if variant and not (isinstance(entry, dict) and is_nvidia_binary(entry.get("runtime_path"), runtime_path)):
        return
    verdict = _check(entry, parts, where, wanted, runtime_path, adopt_existing)
    if verdict == "ours" and variant:
        return  # already our binary, and CRI-O keeps reading it there
    if verdict == "adopt":
        adopted.append({"entry": f"{where}: {tt.dotted(parts)}", "from": entry.get("runtime_path"), "to": wanted})
    copied = dict(entry)
    copied["runtime_path"] = wanted
    if not variant:
        copied["runtime_type"] = "oci"
    edit.add_table(parts, copied)
