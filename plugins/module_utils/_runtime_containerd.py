# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""containerd's rules for the nvidia runtime: config versions 2, 3 and 4, drop-ins, k3s/RKE2 templates (private)."""

from __future__ import annotations

import glob
import json
import os
import re

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

RUNC_SHIM = "io.containerd.runc.v2"
# Version 4 (containerd 2.2 and later) moved the server settings into plugins; the CRI sections are version 3's.
CRI_PLUGIN = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime", 4: "io.containerd.cri.v1.runtime"}
MINIMAL_CONTAINERD_CONFIG = "version = 2\n"
RUNC_MARKER = "gpuops.k8s.nvidia_runtime: containerd's built-in runc, listed so that it stays"
DROP_IN_PATH = "/etc/containerd/conf.d/99-nvidia.toml"
TEMPLATE_BASE = '{{ template "base" . }}'
TEMPLATE_BEGIN = "# BEGIN gpuops.k8s.nvidia_runtime (managed; edit the role's variables instead)"
TEMPLATE_END = "# END gpuops.k8s.nvidia_runtime"
TEMPLATE_NAMES = {2: "config.toml.tmpl", 3: "config-v3.toml.tmpl"}


def parse(text, source):
    """Plain data of a containerd config, or ConfigError with one sentence."""
    return TomlEdit(text, source).before


def containerd_version(data, source):
    if "version" not in data:
        raise ConfigError(
            f"{source} has no top-level version key, which containerd reads as config version 1; "
            "this module edits versions 2, 3 and 4 only (convert it with `containerd config migrate`)."
        )
    version = data["version"]
    if isinstance(version, bool) or version not in CRI_PLUGIN:
        raise ConfigError(
            f"{source} declares containerd config version {json.dumps(version, default=str)}; "
            "this module edits versions 2, 3 and 4 only."
        )
    return version


def _cri_parts(version):
    return ("plugins", CRI_PLUGIN[version], "containerd")


def _cdi_parts(version):
    # containerd 1.7 reads enable_cdi and cdi_spec_dirs in the CRI plugin's own table; 2.x in the
    # runtime part of the CRI plugin.
    return ("plugins", CRI_PLUGIN[version])


def _binary(entry):
    options = entry.get("options") if isinstance(entry.get("options"), dict) else {}
    return options.get("BinaryName")


class _Plan:
    """The options of one edit."""

    def __init__(self, source, name, runtime_path, set_as_default, state, adopt_existing, enable_cdi, spec_dirs):
        # runc as containerd runs it when the edited file has none (a drop-in: the main file's runc).
        self.inherited_runc = None
        self.source = source
        self.name = name
        self.runtime_path = runtime_path
        self.set_as_default = set_as_default
        self.state = state
        self.adopt_existing = adopt_existing
        self.enable_cdi = enable_cdi
        self.cdi_spec_dirs = cdi_dirs(spec_dirs)


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
        binary = _binary(entry)
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


def _new_entry(runc, runtime_path):
    """The nvidia entry: runc's fields and options (so GPU pods behave like every other pod), our binary."""
    entry = {"runtime_type": RUNC_SHIM}
    for key, value in runc.items():
        if key not in ("runtime_type", "options"):
            entry[key] = value
    options = {key: value for key, value in (runc.get("options") or {}).items() if key != "BinaryName"}
    options["BinaryName"] = runtime_path
    entry["options"] = options
    return entry


def _present(edit, plan, version, listed_before):
    parts = _cri_parts(version)
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
        edit.add_table(entry_parts, _new_entry(runc, plan.runtime_path), after=model, model=model, literal=literal)
    # containerd 1.x reads a version 2 file's runtimes table in place of its built-in one, so the
    # first runtime a file lists makes runc disappear: pods and RuntimeClasses asking for runc fail,
    # and a default left at runc stops the CRI plugin from loading. containerd 2.x keeps its runc.
    if version == 2 and plan.name != "runc" and not listed_before:
        edit.add_table(runc_parts, {"runtime_type": RUNC_SHIM}, after=entry_parts, model=entry_parts, literal=literal)
        edit.set_key((*runc_parts, "runtime_type"), RUNC_SHIM, comment=RUNC_MARKER, literal=literal)
    if plan.enable_cdi:
        cdi = _cdi_parts(version)
        # containerd 2.2 and later always read CDI and warn about an enable_cdi key (config version 4).
        if version < 4 and edit.value((*cdi, "enable_cdi")) is not True:
            edit.set_key((*cdi, "enable_cdi"), True)
        if edit.value((*cdi, "cdi_spec_dirs")) != plan.cdi_spec_dirs:
            edit.set_key((*cdi, "cdi_spec_dirs"), plan.cdi_spec_dirs, literal=literal)
    return adopted


def _absent(edit, plan, version):
    parts = _cri_parts(version)
    runtimes_parts = (*parts, "runtimes")
    entry_parts = (*runtimes_parts, plan.name)
    entry = edit.value(entry_parts)
    if entry is not None:
        if not isinstance(entry, dict):
            raise ConfigError(
                f"{plan.source}: {tt.dotted(entry_parts)} is a {type(entry).__name__}, but a table was expected there."
            )
        binary = _binary(entry)
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
    plan = _Plan(source, name, runtime_path, set_as_default, state, adopt_existing, enable_cdi, cdi_spec_dirs)
    plan.inherited_runc = inherited_runc
    parts = _cri_parts(version)
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


# ---------------------------------------------------------------------------------------------
# Imports and drop-in files


def _import_paths(imports, config_path):
    base = os.path.dirname(os.path.abspath(config_path))
    for pattern in imports if isinstance(imports, list) else []:
        if isinstance(pattern, str):
            yield pattern if os.path.isabs(pattern) else os.path.join(base, pattern)


def imports_overriding_cri(imports, config_version, config_path):
    """Imported files that define the version 2 CRI plugin section themselves.

    containerd 1.x merges an imported file's plugin sections over the main file's by replacing each
    whole section, so a runtime added to the main file has no effect when an import also carries
    ``plugins."io.containerd.grpc.v1.cri"``. (containerd 2.x merges them key by key.)
    """
    if config_version != 2:
        return []
    found = []
    for pattern in _import_paths(imports, config_path):
        for imported in sorted(glob.glob(pattern)):
            if os.path.abspath(imported) == os.path.abspath(config_path):
                continue
            try:
                with open(imported, encoding="utf-8") as handle:
                    imported_data = tt.loads(handle.read())
            except (OSError, ValueError, tt.TomlTextError):
                continue
            plugins = imported_data.get("plugins")
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
    import fnmatch

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
    for pattern in _import_paths(main_data.get("imports"), config_path):
        for imported in sorted(glob.glob(pattern)):
            if exclude and os.path.abspath(imported) == os.path.abspath(exclude):
                continue
            try:
                with open(imported, encoding="utf-8") as handle:
                    data = tt.loads(handle.read())
            except (OSError, ValueError, tt.TomlTextError):
                continue
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


def _imported_files(main_data, config_path, exclude=None):
    """The parsed files the main config imports, in containerd's order, ``exclude`` (our drop-in) left out."""
    for pattern in _import_paths(main_data.get("imports"), config_path):
        for imported in sorted(glob.glob(pattern)):
            if os.path.abspath(imported) == os.path.abspath(config_path):
                continue
            if exclude and os.path.abspath(imported) == os.path.abspath(exclude):
                continue
            try:
                with open(imported, encoding="utf-8") as handle:
                    yield imported, tt.loads(handle.read())
            except (OSError, ValueError, tt.TomlTextError):
                continue


def effective_runc(main_data, version, config_path, exclude=None):
    """runc's entry as containerd 2.x merges it, key by key, from the main file and the other imported files."""
    parts = (*_cri_parts(version), "runtimes", "runc")
    runc = plain_at(main_data, parts)
    runc = runc if isinstance(runc, dict) else {}
    for _path, data in _imported_files(main_data, config_path, exclude):
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


# ---------------------------------------------------------------------------------------------
# k3s and RKE2 templates

# The first line k3s and RKE2 write into the containerd config they generate at every start.
_GENERATED_RE = re.compile(r"^\ufeff?# File generated by (?P<program>[\w.-]+)\. DO NOT EDIT\.")


def generated_by(text):
    """The program (k3s, rke2) that generated this containerd config at its start, or None."""
    match = _GENERATED_RE.match(text or "")
    return match.group("program") if match else None


def rancher_drop_in_text(version):
    """What a drop-in beside a k3s/RKE2 config starts from: the version alone.

    The k3s and RKE2 releases that import a drop-in directory (v1.33.10, v1.34.6, v1.35.3, v1.36.0 and
    later) ship containerd 2.x, which merges an imported file key by key; carrying the CRI section
    would freeze what k3s decides at each start (the cgroup driver, the sandbox image).
    """
    return f"version = {version}\n"


def template_name(version):
    # k3s and RKE2 name the template of a version 3 config config-v3.toml.tmpl; a later version keeps that name.
    return TEMPLATE_NAMES[min(version, 3)]


def template_path_for(generated, source):
    """The template next to a generated config: config.toml.tmpl (version 2) or config-v3.toml.tmpl (version 3)."""
    version = containerd_version(TomlEdit(strip_rendered_block(generated), source).before, source)
    return os.path.join(os.path.dirname(source), template_name(version))


def split_template(text):
    """(the template without our block, our block's TOML or None)."""
    pattern = re.compile(
        r"(?:\r?\n)?"
        + re.escape(TEMPLATE_BEGIN)
        + r"\r?\n(?P<body>.*?)"
        + re.escape(TEMPLATE_END)
        + r"[^\n]*(?:\r?\n)?",
        re.S,
    )
    match = pattern.search(text)
    if not match:
        return text, None
    # The blank line in front of the block is the one template_text wrote: it goes with the block.
    return text[: match.start()] + text[match.end() :], match.group("body")


def strip_rendered_block(rendered):
    """The generated config without what our template block added (what ``base`` alone renders)."""
    return split_template(rendered)[0]


def template_text(current, block):
    """A template built on ``base`` with our ``block`` (None: no block) at its end."""
    kept, _old = split_template(current if current is not None else "")
    if not kept.strip():
        kept = TEMPLATE_BASE + "\n"
    elif TEMPLATE_BASE not in kept and "{{" not in kept:
        raise ConfigError(
            'the existing template does not build on the base template ({{ template "base" . }}) '
            "and would replace k3s's whole config; add that line or remove the template first."
        )
    if block is None:
        return kept
    if not kept.endswith("\n"):
        kept += "\n"
    return kept + "\n" + TEMPLATE_BEGIN + "\n" + block + TEMPLATE_END + "\n"


def template_guard(name):
    """The Go template condition under which our tables render: k3s found no runtime of that name itself.

    k3s and RKE2 add ``nvidia`` (and ``nvidia-cdi``) by themselves once they find the toolkit on the
    node, and a table declared twice stops containerd. The toolkit is often installed after the
    template was written, so whether base renders the runtime is decided at every k3s start, and the
    block must ask the same question then. ``index`` of a runtime k3s did not find gives an empty
    entry, whose BinaryName is empty.
    """
    return "{{ if not (index .ExtraRuntimes " + json.dumps(name) + ").BinaryName }}"


def template_block(base_text, source, plan):
    """Our block for a k3s/RKE2 template: the runtime's tables, rendered only where base lacks them.

    A template cannot change a table that ``base`` already writes (TOML forbids a table twice), so
    the block only adds the runtime entry; the default runtime is k3s's own ``default-runtime``
    setting (the role writes it). An entry that base renders with another binary is reported.
    """
    edit = TomlEdit(base_text, source)
    version = containerd_version(edit.before, source)
    parts = _cri_parts(version)
    entry_parts = (*parts, "runtimes", plan.name)
    notes = []
    entry = edit.value(entry_parts)
    runc = edit.value((*parts, "runtimes", "runc"))
    new = _new_entry(runc if isinstance(runc, dict) else {}, plan.runtime_path)
    options = new.pop("options")
    tables = [f"[{tt.dotted(entry_parts)}]"]
    tables += [f"  {tt.key_text(k)} = {tt.value_text(v)}" for k, v in new.items()]
    tables += [f"[{tt.dotted((*entry_parts, 'options'))}]"]
    for key, value in options.items():
        # k3s decides runc's cgroup driver at every start ({{ .SystemdCgroup }} in its base template):
        # the runtime follows that decision, not the value of the start the template was written after.
        rendered_value = "{{ $.SystemdCgroup }}" if key == "SystemdCgroup" else tt.value_text(value)
        tables.append(f"  {tt.key_text(key)} = {rendered_value}")
    body = "\n".join(tables) + "\n"
    if isinstance(entry, dict) and _binary(entry) != plan.runtime_path:
        notes.append(
            f"k3s renders the runtime {plan.name} itself with BinaryName {json.dumps(_binary(entry))} (it looks in "
            "/usr/local/nvidia/toolkit before PATH); a template cannot redefine it, so that binary stays in use."
        )
    if entry is None:
        # Where base lacks the runtime the tables render: they must fit what base writes.
        combined = (
            base_text + ("" if base_text.endswith("\n") else "\n") + body.replace("{{ $.SystemdCgroup }}", "true")
        )
        try:
            tt.loads(combined)
        except tt.TomlTextError as exc:
            raise ConfigError(f"{source}: the runtime's tables would not fit the generated config ({exc}).") from None
    if plan.enable_cdi and edit.value((*_cdi_parts(version), "enable_cdi")) is not True and version == 2:
        notes.append(
            "CDI cannot be switched on through a k3s/RKE2 template (base writes the CRI table); "
            "their containerd 2.x (config version 3) has it on by default."
        )
    block = template_guard(plan.name) + "\n" + body + "{{ end }}\n"
    rendered = entry if isinstance(entry, dict) else {**new, "options": options}
    return block, notes, rendered


def edit_template(generated, current, source, template_path=None, **args):
    """The k3s/RKE2 template for the runtime: (template path, its new text or None, EditResult).

    ``generated`` is the config.toml that k3s or RKE2 wrote at its last start (with our block, if a
    template of ours was in use), ``current`` the template's text (None: there is none).
    """
    base = strip_rendered_block(generated)
    data = TomlEdit(base, source).before
    version = containerd_version(data, source)
    template = template_path or os.path.join(os.path.dirname(source), template_name(version))
    plan = _Plan(
        source,
        args["name"],
        args["runtime_path"],
        args["set_as_default"],
        args["state"],
        args.get("adopt_existing", True),
        args.get("enable_cdi", False),
        args.get("cdi_spec_dirs"),
    )
    block, notes, entry = None, [], None
    if plan.state == "present":
        block, notes, entry = template_block(base, source, plan)
        if plan.set_as_default and plain_at(data, (*_cri_parts(version), "default_runtime_name")) != plan.name:
            notes.append(
                f"the default runtime of k3s and RKE2 is their own default-runtime setting (default-runtime: "
                f"{plan.name} in their config.yaml), not the template's; the nvidia_runtime role writes it."
            )
    try:
        new = template_text(current, block)
    except ConfigError as exc:
        raise ConfigError(f"{template}: {exc}") from None
    if block is None and (current is None or new == TEMPLATE_BASE + "\n"):
        new = None  # base alone is what k3s renders without a template: no file needed
    parts = _cri_parts(version)
    result = EditResult(
        new,
        new != current,
        entry,
        plain_at(data, (*parts, "default_runtime_name")) or "runc",
        config_version=version,
        notes=notes,
    )
    return template, result
