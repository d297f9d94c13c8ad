# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""containerd's rules for the nvidia runtime: config versions 2, 3 and 4, drop-ins, k3s/RKE2 templates (private).

This file edits one containerd config, a main file or a drop-in (``edit_containerd``): the nvidia entry,
the variants other installers left, the default runtime and CDI. What the edits share (versions, CRI
table paths, the entry's shape) is in ``_runtime_containerd_base``; the questions around a drop-in
(imports, what it starts from) in ``_runtime_containerd_dropin``; k3s and RKE2, whose config is
generated from a template, in ``_runtime_containerd_rancher``. Callers import this module only: it
names what the other three provide.
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
    comment_without_marker,
    foreign_entry_error,
    is_nvidia_binary,
    marker_comment,
    plain_at,
    read_marker,
    variant_binary,
)
from ansible_collections.gpuops.k8s.plugins.module_utils._runtime_containerd_base import (
    CRI_PLUGIN,
    MINIMAL_CONTAINERD_CONFIG,
    RUNC_SHIM,
    Plan,
    binary_of,
    cdi_parts,
    containerd_version,
    cri_parts,
    new_entry,
    parse,
)
from ansible_collections.gpuops.k8s.plugins.module_utils._runtime_containerd_dropin import (
    DROP_IN_PATH,
    covers,
    drop_in_base,
    drop_in_default,
    drop_in_import,
    effective_cri_v2,
    effective_runc,
    ensure_import,
    imports_directory,
    imports_overriding_cri,
)
from ansible_collections.gpuops.k8s.plugins.module_utils._runtime_containerd_rancher import (
    TEMPLATE_BASE,
    TEMPLATE_BEGIN,
    TEMPLATE_END,
    TEMPLATE_NAMES,
    edit_template,
    generated_by,
    rancher_drop_in_text,
    split_template,
    strip_rendered_block,
    template_block,
    template_guard,
    template_name,
    template_path_for,
    template_text,
)

__all__ = (
    "CRI_PLUGIN",
    "DROP_IN_PATH",
    "MINIMAL_CONTAINERD_CONFIG",
    "RUNC_MARKER",
    "RUNC_SHIM",
    "TEMPLATE_BASE",
    "TEMPLATE_BEGIN",
    "TEMPLATE_END",
    "TEMPLATE_NAMES",
    "containerd_version",
    "covers",
    "drop_in_base",
    "drop_in_default",
    "drop_in_import",
    "edit_containerd",
    "edit_template",
    "effective_cri_v2",
    "effective_runc",
    "ensure_import",
    "generated_by",
    "imports_directory",
    "imports_overriding_cri",
    "parse",
    "rancher_drop_in_text",
    "split_template",
    "strip_rendered_block",
    "template_block",
    "template_guard",
    "template_name",
    "template_path_for",
    "template_text",
)

RUNC_MARKER = "gpuops.k8s.nvidia_runtime: containerd's built-in runc, listed so that it stays"


def _converge_entries(edit, plan, runtimes_parts, adopted):
    """Bring the nvidia entry and the variants other installers left to our binaries (or refuse)."""
    runtimes = edit.value(runtimes_parts)
    runtimes = runtimes if isinstance(runtimes, dict) else {}
    for variant in NVIDIA_VARIANTS:
        key = plan.name + variant
        entry = runtimes.get(key)
        if entry is None:
            continue
        entry_parts = (*runtimes_parts, key)
        if not isinstance(entry, dict):
            raise ConfigError(
                f"{plan.source}: {tt.dotted(entry_parts)} is a {type(entry).__name__}, but a table was expected there."
            )
        wanted = variant_binary(plan.runtime_path, variant)
        binary = binary_of(entry)
        runtime_type = entry.get("runtime_type")
        ours = runtime_type in (None, "", RUNC_SHIM) and binary in (None, "", wanted)
        theirs = runtime_type in (None, "", RUNC_SHIM) and is_nvidia_binary(binary, plan.runtime_path)
        if variant and not theirs:
            continue  # a variant is only ever adjusted, never claimed
        if not ours and not theirs:
            raise foreign_entry_error(
                plan.source,
                tt.dotted(entry_parts),
                f"runtime_type {json.dumps(runtime_type)} and BinaryName {json.dumps(binary)}",
                plan.runtime_path,
            )
        if binary not in (None, "", wanted) and not plan.adopt_existing:
            raise adoption_error(plan.source, tt.dotted(entry_parts), binary, wanted)
        if variant and binary == wanted:
            continue
        if binary not in (None, "", wanted):
            adopted.append({"entry": tt.dotted(entry_parts), "from": binary, "to": wanted})
        if variant:
            edit.set_key(
                (*entry_parts, "options", "BinaryName"),
                wanted,
                literal=edit.literal_quotes((*entry_parts, "options", "BinaryName")),
            )
            continue
        literal = edit.literal_quotes((*runtimes_parts, "runc", "runtime_type"))
        if runtime_type != RUNC_SHIM:
            edit.set_key((*entry_parts, "runtime_type"), RUNC_SHIM, literal=literal)
        if binary != wanted:
            edit.set_key((*entry_parts, "options", "BinaryName"), wanted, literal=literal)
        # The cgroup driver has to match the kubelet's: follow runc when it says which one.
        runc_options = plain_at(_runc(edit, plan, runtimes_parts), ("options",))
        options = plain_at(edit.after, (*entry_parts, "options")) or {}
        if (
            isinstance(runc_options, dict)
            and "SystemdCgroup" in runc_options
            and options.get("SystemdCgroup") != runc_options["SystemdCgroup"]
        ):
            edit.set_key((*entry_parts, "options", "SystemdCgroup"), runc_options["SystemdCgroup"])


def _runc(edit, plan, runtimes_parts):
    """The runc entry the nvidia entry follows: the file's own, else the one containerd merges in from elsewhere."""
    runc = edit.value((*runtimes_parts, "runc"))
    if isinstance(runc, dict):
        return runc
    return plan.inherited_runc if isinstance(plan.inherited_runc, dict) else {}


def _present(edit, plan, version, listed_before):
    parts = cri_parts(version)
    runtimes_parts = (*parts, "runtimes")
    entry_parts = (*runtimes_parts, plan.name)
    adopted = []
    listed = edit.value(runtimes_parts)
    if listed is not None and not isinstance(listed, dict):
        raise ConfigError(
            f"{plan.source}: {tt.dotted(runtimes_parts)} is a {type(listed).__name__}, but a table was expected there."
        )
    _converge_entries(edit, plan, runtimes_parts, adopted)
    runc_parts = (*runtimes_parts, "runc")
    runc = _runc(edit, plan, runtimes_parts)
    literal = edit.literal_quotes((*runc_parts, "runtime_type"))
    default_parts = (*parts, "default_runtime_name")
    current = edit.value(default_parts)
    if plan.set_as_default and current != plan.name:
        user_comment = comment_without_marker(edit.comment(default_parts)) if current is not None else ""
        marker = marker_comment(current, table_added=not edit.defined(parts))
        comment = f"{user_comment} # {marker}" if user_comment else marker
        edit.set_key(default_parts, plan.name, comment=comment, literal=edit.literal_quotes(default_parts))
    if edit.value(entry_parts) is None:
        model = runc_parts if edit.doc.header(runc_parts) else None
        if model is None:
            siblings = [s.path for s in edit.doc.statements if s.kind == "table" and len(s.path) == len(entry_parts)]
            siblings = [p for p in siblings if p[:-1] == runtimes_parts]
            model = siblings[0] if siblings else None
        edit.add_table(entry_parts, new_entry(runc, plan.runtime_path), after=model, model=model, literal=literal)
    # containerd 1.x reads a version 2 file's runtimes table in place of its built-in one, so the
    # first runtime a file lists makes runc disappear: pods and RuntimeClasses asking for runc fail,
    # and a default left at runc stops the CRI plugin from loading. containerd 2.x keeps its runc.
    if version == 2 and plan.name != "runc" and not listed_before:
        edit.add_table(runc_parts, {"runtime_type": RUNC_SHIM}, after=entry_parts, model=entry_parts, literal=literal)
        edit.set_key((*runc_parts, "runtime_type"), RUNC_SHIM, comment=RUNC_MARKER, literal=literal)
    if plan.enable_cdi:
        cdi = cdi_parts(version)
        # containerd 2.2 and later always read CDI and warn about an enable_cdi key (config version 4).
        if version < 4 and edit.value((*cdi, "enable_cdi")) is not True:
            edit.set_key((*cdi, "enable_cdi"), True)
        if edit.value((*cdi, "cdi_spec_dirs")) != plan.cdi_spec_dirs:
            edit.set_key((*cdi, "cdi_spec_dirs"), plan.cdi_spec_dirs, literal=literal)
    return adopted


def _absent(edit, plan, version):
    parts = cri_parts(version)
    runtimes_parts = (*parts, "runtimes")
    entry_parts = (*runtimes_parts, plan.name)
    entry = edit.value(entry_parts)
    if entry is not None:
        if not isinstance(entry, dict):
            raise ConfigError(
                f"{plan.source}: {tt.dotted(entry_parts)} is a {type(entry).__name__}, but a table was expected there."
            )
        binary = binary_of(entry)
        runtime_type = entry.get("runtime_type")
        if runtime_type not in (None, "", RUNC_SHIM) or not (
            binary in (None, "", plan.runtime_path) or is_nvidia_binary(binary, plan.runtime_path)
        ):
            raise foreign_entry_error(
                plan.source,
                tt.dotted(entry_parts),
                f"runtime_type {json.dumps(runtime_type)} and BinaryName {json.dumps(binary)}",
                plan.runtime_path,
            )
    # The runc entry `present` listed goes while it is, besides ours, the only runtime and unchanged.
    runc_parts = (*runtimes_parts, "runc")
    listed = edit.value(runtimes_parts)
    others = {k: v for k, v in listed.items() if k != plan.name} if isinstance(listed, dict) else None
    if (
        version == 2
        and others == {"runc": {"runtime_type": RUNC_SHIM}}
        and RUNC_MARKER in edit.comment((*runc_parts, "runtime_type"))
    ):
        edit.remove(runc_parts)
    if entry is not None:
        edit.remove(entry_parts)
    default_parts = (*parts, "default_runtime_name")
    if edit.value(default_parts) == plan.name:
        found, previous, table_added = read_marker(edit.comment(default_parts))
        if not found:
            # Set by someone else: fall back to the built-in default rather than leave the default
            # pointing at a runtime that no longer exists.
            previous = None
        if previous is None:
            edit.remove(default_parts)
            if table_added:
                edit.drop_empty_header(parts)
        else:
            user_comment = comment_without_marker(edit.comment(default_parts))
            edit.set_key(default_parts, previous, comment=user_comment, literal=edit.literal_quotes(default_parts))
    edit.prune_empty(runtimes_parts)


def edit_containerd(
    text,
    source,
    name,
    runtime_path,
    set_as_default,
    state,
    adopt_existing=True,
    enable_cdi=False,
    cdi_spec_dirs=None,
    inherited_runc=None,
):
    """Add (or remove) the nvidia runtime in a containerd config of version 2 or 3.

    ``inherited_runc``: the runc entry containerd merges in from other files (for a drop-in, the main file's
    and earlier imports'), which the nvidia entry follows where the edited file lists no runc itself.
    """
    edit = TomlEdit(text, source)
    version = containerd_version(edit.before, source)
    plan = Plan(source, name, runtime_path, set_as_default, state, adopt_existing, enable_cdi, cdi_spec_dirs)
    plan.inherited_runc = inherited_runc
    parts = cri_parts(version)
    adopted = []
    if state == "present":
        listed = plain_at(edit.before, (*parts, "runtimes"))
        adopted = _present(edit, plan, version, bool(listed))
    else:
        _absent(edit, plan, version)
    new_text, changed = edit.finish()
    after = edit.after
    entry = plain_at(after, (*parts, "runtimes", name))
    default = plain_at(after, (*parts, "default_runtime_name"))
    return EditResult(
        new_text,
        changed,
        entry,
        default or "runc",
        config_version=version,
        imports=after.get("imports"),
        adopted=adopted,
    )
