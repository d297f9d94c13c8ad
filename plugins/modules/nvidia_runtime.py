#!/usr/bin/python
# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_runtime
short_description: Configure the nvidia runtime in containerd, Docker or CRI-O
version_added: 0.1.0
description:
  - Adds (or removes) the NVIDIA container runtime in the configuration of containerd, Docker or CRI-O,
    and optionally makes it the default runtime.
  - Only the keys of the nvidia runtime, the default runtime and (when asked) CDI change; every other key,
    comment, blank line and line end of the file stays byte for byte as it was.
  - "How TOML files are edited: as text. The module finds where the statements it owns stand (table headers,
    key/value pairs, inline tables), changes only those spans, and parses the result with a strict TOML parser
    (the standard library's C(tomllib) on Python 3.11 and newer, else C(tomli), else tomlkit's parser) to check
    that the file means exactly what was intended before anything is written. A round-tripping TOML library
    is not used because it re-renders what it is given: on configs that set CRI keys with dotted keys it put
    the runtime under the wrong table, and some valid layouts stopped it with internal errors."
  - "containerd: config versions 2, 3 and 4 (read from the file; 4 is what containerd 2.2 and later write).
    The runtime is added under C(plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.<name>) (version 2) or
    C(plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.<name>) (versions 3 and 4). It inherits the fields
    and C(options) of the existing C(runc) runtime (C(SystemdCgroup) and the rest), with
    C(runtime_type = \"io.containerd.runc.v2\") and C(options.BinaryName) set to O(runtime_path)."
  - "containerd, where the config goes (O(config_mode)): into the main file; into a drop-in file that the
    main file imports (the main file gains only the import); or into the C(config.toml.tmpl) /
    C(config-v3.toml.tmpl) template of k3s or RKE2, built on C({{ template \"base\" . }}), since they
    regenerate C(config.toml) at every start."
  - When the containerd config file does not exist it is created from C(containerd config default) if the
    C(containerd) binary is on the target, or from a minimal version 2 file otherwise.
  - "Docker: C(runtimes.<name>) in C(daemon.json) with C(path) and C(args), and C(default-runtime). Key order and
    the file's indentation are kept."
  - "CRI-O: a drop-in file with C([crio.runtime.runtimes.<name>]) and C([crio.runtime] default_runtime). The other
    files CRI-O reads (C(crio.conf), then every file of C(crio.conf.d) in lexical order, whatever its name ends in,
    later ones overriding earlier keys and replacing a runtime's whole entry) are read first; one that cannot be
    parsed stops O(state=present) with nothing written, since CRI-O would not start with it. An NVIDIA entry an
    earlier file defines (C(99-nvidia.conf) of C(nvidia-ctk), say) is adopted into the drop-in with its other keys;
    a later file that overrides the runtime or the default, and on O(state=absent) a runtime another file still
    defines, is reported as a warning."
  - "Entries that the GPU Operator, C(nvidia-ctk) or k3s wrote (O(runtime_name) and its C(-cdi) and C(-legacy)
    variants from the GPU Operator and C(nvidia-ctk), C(-cdi) and C(-experimental) from k3s, with a binary under
    C(/usr/local/nvidia/toolkit/), C(/opt/kwasm/bin/), C(/usr/local/bin/) or C(/usr/bin/)) are adopted. Their
    binary is pointed at O(runtime_path), the variants at the matching C(nvidia-container-runtime.cdi),
    C(nvidia-container-runtime.legacy) or (k3s) C(nvidia-container-runtime-experimental) next to it, and every
    other option stays (see O(adopt_existing))."
  - >-
    When O(state=present) changes the default runtime it records the previous one, so that O(state=absent)
    can restore it. In TOML files that record is a comment on the default-runtime line
    (C(# gpuops.k8s.nvidia_runtime: previous default "runc")). Docker rejects unknown keys in C(daemon.json)
    and JSON has no comments, so for Docker it is a small JSON file next to the config,
    C(<config_path>.nvidia-runtime-state).
  - Writes are atomic and keep the file's mode and owner. A file that cannot be parsed is left untouched.
  - The container runtime is not restarted; notify a handler for that.
author:
  - gpuops.k8s maintainers (@gpuops)
requirements:
  - "For O(runtime=containerd) and O(runtime=crio) on Python older than 3.11: C(tomli) (or tomlkit) on the target."
options:
  runtime:
    description:
      - The container runtime whose configuration is edited.
    type: str
    required: true
    choices: [containerd, docker, crio]
  config_path:
    description:
      - The configuration file to edit.
      - Defaults to C(/etc/containerd/config.toml), C(/etc/docker/daemon.json) or
        C(/etc/crio/crio.conf.d/99-nvidia.toml), according to O(runtime).
      - With O(config_mode=template), the C(config.toml) that k3s or RKE2 generated (read, never written), for
        example C(/var/lib/rancher/k3s/agent/etc/containerd/config.toml).
    type: path
  config_mode:
    description:
      - containerd only. Where the runtime goes.
      - V(file) edits O(config_path) itself.
      - V(drop_in) writes the runtime into O(drop_in_path) and adds that file's directory (C(<dir>/*.toml)) to the
        C(imports) of O(config_path), as C(nvidia-ctk) 1.17 and newer do; the main file is otherwise untouched.
        For a version 2 main file the drop-in also carries the main file's CRI section, since containerd 1.x
        replaces a whole plugin section with an imported one; later edits of that section in the main file are
        then shadowed by the drop-in. O(state=absent) removes the drop-in file and keeps the import.
      - V(template) writes a k3s or RKE2 template (O(template_path)) built on the base template, with a marked
        block that adds the runtime only where the generated config lacks it. A template cannot change the tables
        the base template writes, so the default runtime is k3s's and RKE2's own C(default-runtime) setting,
        which the C(nvidia_runtime) role writes.
      - V(auto) is V(drop_in) when O(config_path) already imports a drop-in directory (a glob), else V(file).
      - A config that k3s or RKE2 generated (recognised by the first line they write) is never edited itself, since
        they rewrite it at every start; V(file) is refused. There V(auto) is V(drop_in) when it imports a drop-in
        directory (C(config-v3.toml.d) or C(config.toml.d), k3s v1.33.10, v1.34.6, v1.35.3, v1.36.0 and later),
        else V(template); the drop-in holds only the runtime, with runc's C(SystemdCgroup), and a template block
        of this module from before is removed after the drop-in is written.
      - With V(drop_in) the drop-in is written before the main file's import, so that a failure between the two
        writes leaves a configuration containerd loads.
    type: str
    choices: [auto, file, drop_in, template]
    default: auto
  drop_in_path:
    description:
      - containerd with O(config_mode=drop_in) (or V(auto) choosing it) only. The drop-in file.
      - By default C(99-nvidia.toml) in the directory that O(config_path) already imports (a glob such as
        C(conf.d/*.toml)), else C(/etc/containerd/conf.d/99-nvidia.toml).
    type: path
  template_path:
    description:
      - containerd with O(config_mode=template) only. The template file; by default C(config.toml.tmpl) (version 2
        generated config) or C(config-v3.toml.tmpl) (version 3) next to O(config_path).
    type: path
  runtime_name:
    description:
      - The name of the runtime entry.
      - An existing entry of that name that points to another runtime makes the module fail rather than replace it.
    type: str
    default: nvidia
  runtime_path:
    description:
      - The NVIDIA container runtime binary.
    type: path
    default: /usr/bin/nvidia-container-runtime
  set_as_default:
    description:
      - Make the nvidia runtime the default runtime.
      - When V(false), the default runtime is left as it is, also when someone else made it the nvidia runtime;
        the module changes the default only when asked to.
    type: bool
    default: true
  adopt_existing:
    description:
      - Converge NVIDIA runtime entries that other installers wrote (see the description) to O(runtime_path).
      - When V(false), such an entry with another binary makes the module fail with a message naming it.
    type: bool
    default: true
  enable_cdi:
    description:
      - Switch on the Container Device Interface in the runtime, for device-plugin and DRA strategies that hand
        devices over as CDI names.
      - containerd C(enable_cdi = true) and C(cdi_spec_dirs) in the CRI plugin (needed by 1.7, on by default in
        2.x); Docker C(features.cdi = true); CRI-O C(cdi_spec_dirs) in C([crio.runtime]) (CRI-O always reads CDI).
      - V(false) leaves CDI settings as they are; O(state=absent) leaves them too.
    type: bool
    default: false
  cdi_spec_dirs:
    description:
      - The directories CDI specs are read from, when O(enable_cdi=true).
    type: list
    elements: path
    default: [/etc/cdi, /var/run/cdi]
  state:
    description:
      - V(present) adds the runtime (and makes it the default when O(set_as_default=true)).
      - V(absent) removes the runtime and, if it is the default, restores the default that V(present) replaced
        (the runtime's built-in default when there is no record of one). A CRI-O file in a drop-in directory
        that is left with nothing in it (the one V(present) created) is removed.
    type: str
    choices: [present, absent]
    default: present
  backup:
    description:
      - Keep a timestamped copy of the original file when it changes, beside it; for a file in a drop-in
        directory (a name ending in C(.d), such as C(crio.conf.d), C(conf.d) or C(config-v3.toml.d)), in
        C(<that directory>.gpuops-backup) beside the directory instead, since the runtime reads every file
        of its drop-in directory.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: Computes the change and the diff without writing anything.
  diff_mode:
    support: full
    description: Returns each changed file's text before and after the change, with its path as header.
notes:
  - Idempotent; a second run with the same options reports no change.
  - For containerd, an existing runtime entry of the same name with C(runtime_type = "io.containerd.runc.v2") and
    the same (or no) C(BinaryName) is treated as the nvidia runtime; its C(SystemdCgroup) follows C(runc).
  - containerd 1.x serves only the runtimes a version 2 file lists. On a version 2 file that lists none, the
    module therefore lists the built-in C(runc) next to the new runtime, marked, and C(state=absent) removes it
    again while it is the only other runtime listed and unchanged.
  - Any valid file is either converged or refused with one sentence that names the file and the key; an edit
    whose result would not parse to exactly the intended settings is refused and nothing is written.
seealso:
  - name: containerd configuration
    description: The containerd config file format (versions 2, 3 and 4).
    link: https://github.com/containerd/containerd/blob/main/docs/cri/config.md
"""

EXAMPLES = r"""
- name: Make nvidia the default runtime of containerd
  gpuops.k8s.nvidia_runtime:
    runtime: containerd
  notify: Restart containerd

- name: Put the runtime into a containerd drop-in, with CDI on
  gpuops.k8s.nvidia_runtime:
    runtime: containerd
    config_mode: drop_in
    drop_in_path: /etc/containerd/conf.d/99-nvidia.toml
    enable_cdi: true

- name: Add the runtime to the containerd of k3s through its template
  gpuops.k8s.nvidia_runtime:
    runtime: containerd
    config_mode: template
    config_path: /var/lib/rancher/k3s/agent/etc/containerd/config.toml
    set_as_default: false

- name: Add the nvidia runtime to Docker without making it the default, keeping a backup
  gpuops.k8s.nvidia_runtime:
    runtime: docker
    set_as_default: false
    backup: true

- name: Configure CRI-O with a drop-in file
  gpuops.k8s.nvidia_runtime:
    runtime: crio
    config_path: /etc/crio/crio.conf.d/99-nvidia.toml
    runtime_path: /usr/local/bin/nvidia-container-runtime

- name: Remove the nvidia runtime again and restore the previous default
  gpuops.k8s.nvidia_runtime:
    runtime: containerd
    state: absent
"""

RETURN = r"""
config_path:
  description: The file that holds the runtime (the drop-in or the template in those modes).
  returned: always
  type: str
  sample: /etc/containerd/config.toml
config_mode:
  description: Where the runtime went (containerd), one of V(file), V(drop_in) or V(template).
  returned: when O(runtime=containerd)
  type: str
  sample: file
changed_files:
  description: The files this run changed (or would change, in check mode).
  returned: always
  type: list
  elements: str
  sample: [/etc/containerd/config.toml]
config_exists:
  description:
    - Whether RV(config_path) exists after the run (or would, in check mode); V(false) where V(absent) removed it
      or found none.
  returned: always
  type: bool
  sample: true
removed_files:
  description: Of RV(changed_files), those this run removed (or would remove, in check mode).
  returned: always
  type: list
  elements: str
  sample: [/etc/crio/crio.conf.d/99-nvidia.toml]
runtime_entry:
  description:
    - The nvidia runtime's entry as the file now holds it; null when absent (in template mode, what the block adds).
  returned: always
  type: dict
  sample:
    runtime_type: io.containerd.runc.v2
    options:
      BinaryName: /usr/bin/nvidia-container-runtime
      SystemdCgroup: true
default_runtime:
  description:
    - The default runtime after the change. For containerd and Docker the built-in default C(runc) when the file
      names none; for CRI-O null when the file names none (CRI-O's own default applies).
  returned: always
  type: str
  sample: nvidia
adopted:
  description: Entries of other installers whose binary was pointed at ours.
  returned: always
  type: list
  elements: dict
  sample:
    - entry: plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia
      from: /usr/local/nvidia/toolkit/nvidia-container-runtime
      to: /usr/bin/nvidia-container-runtime
config_version:
  description: The containerd config version of the file.
  returned: when O(runtime=containerd)
  type: int
  sample: 2
backup_file:
  description: The backup copy of the original file (the last one, when several files changed).
  returned: when a backup was made
  type: str
  sample: /etc/containerd/config.toml.12345.2026-01-01@10:00:00~
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpuops.k8s.plugins.module_utils import _runtime_containerd as ctd
from ansible_collections.gpuops.k8s.plugins.module_utils._files import (
    backup_file,
    file_diff,
    read_text,
    remove_file,
    write_atomic,
)
from ansible_collections.gpuops.k8s.plugins.module_utils._runtime_config import ConfigError
from ansible_collections.gpuops.k8s.plugins.module_utils._last_resort import run_or_fail
from ansible_collections.gpuops.k8s.plugins.module_utils._runtime_crio import edit_crio
from ansible_collections.gpuops.k8s.plugins.module_utils._runtime_docker import edit_docker
from ansible_collections.gpuops.k8s.plugins.module_utils import _toml_text as tt
from ansible_collections.gpuops.k8s.plugins.module_utils._toml_text import HAS_TOML_PARSER

DEFAULT_PATHS = {
    "containerd": "/etc/containerd/config.toml",
    "docker": "/etc/docker/daemon.json",
    "crio": "/etc/crio/crio.conf.d/99-nvidia.toml",
}
DOCKER_STATE_SUFFIX = ".nvidia-runtime-state"


class Change:
    """One file's text before and after (``after`` None: the file is removed, or never created)."""

    def __init__(self, path, before, after, mode=0o644):
        self.path = path
        self.before = before
        self.after = after
        self.mode = mode

    @property
    def changed(self):
        return self.before != self.after


def _containerd_default_config(module):
    """containerd's own default config when the binary is there, else a minimal version 2 file."""
    binary = module.get_bin_path("containerd")
    if binary:
        rc, out, err = module.run_command([binary, "config", "default"])
        if rc == 0 and out.strip():
            return out
        module.warn(
            f"`{binary} config default` failed (rc={rc}): {err.strip()}; starting from a minimal version 2 config."
        )
    return ctd.MINIMAL_CONTAINERD_CONFIG


def _read(module, path):
    if os.path.isdir(path):
        module.fail_json(msg=f"{path} is a directory, not a file.")
    try:
        return read_text(path)
    except (OSError, UnicodeDecodeError) as exc:
        module.fail_json(msg=f"Cannot read {path}: {exc}.")


def _read_state_doc(module, path):
    text = _read(module, path)
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        module.fail_json(
            msg=f"{path} is not valid JSON; remove it or fix it (it records the previous default runtime)."
        )
    return data if isinstance(data, dict) else None


def _edit_args(params):
    return dict(
        name=params["runtime_name"],
        runtime_path=params["runtime_path"],
        set_as_default=params["set_as_default"],
        state=params["state"],
        adopt_existing=params["adopt_existing"],
        enable_cdi=params["enable_cdi"],
        cdi_spec_dirs=params["cdi_spec_dirs"],
    )


def _containerd_file(module, path, original, args):
    """The edit of one containerd config file (created from the default config where missing)."""
    start = original
    if original is None or not original.strip():
        if args["state"] == "absent":
            return None, original
        start = _containerd_default_config(module)
    return ctd.edit_containerd(start, path, **args), start


def _containerd(module, result):
    params = module.params
    args = _edit_args(params)
    path = params["config_path"] or DEFAULT_PATHS["containerd"]
    mode = params["config_mode"]
    original = _read(module, path)

    program = ctd.generated_by(original)
    if mode == "template":
        return _containerd_template(module, result, path, original, args)

    imports = None
    if original is not None and original.strip():
        try:
            main_data = ctd.parse(ctd.strip_rendered_block(original) if program else original, path)
        except ConfigError as exc:
            module.fail_json(msg=str(exc), **result)
        imports = main_data.get("imports")
    if program:
        return _containerd_rancher(module, result, path, original, main_data, program, args)
    if mode == "auto":
        mode = "drop_in" if ctd.imports_directory(imports, path) else "file"
    result["config_mode"] = mode

    if mode == "file":
        edit, _start = _containerd_file(module, path, original, args)
        if edit is None:  # absent, and there is no containerd config at all
            result.update(runtime_entry=None, default_runtime="runc")
            return []
        if args["state"] == "present":
            for imported in ctd.imports_overriding_cri(edit.imports, edit.config_version, path):
                module.warn(
                    f"{imported} also configures the plugin io.containerd.grpc.v1.cri; containerd 1.x replaces that "
                    f"whole section with the imported one, so the runtime added to {path} does not take effect there "
                    "(set config_mode to drop_in with that file as drop_in_path, or config_path to it)."
                )
        _report(result, edit)
        new_text = None if original is None and args["state"] == "absent" else edit.text
        return [Change(path, original, new_text)]

    # drop_in
    drop_in = params["drop_in_path"] or ctd.drop_in_default(imports, path)
    result["config_path"] = drop_in
    drop_in_text = _read(module, drop_in)
    if args["state"] == "absent":
        if drop_in_text is None:
            result.update(runtime_entry=None, default_runtime="runc")
            return []
        edit = ctd.edit_containerd(drop_in_text, drop_in, **args)
        _report(result, edit)
        return [Change(drop_in, drop_in_text, None)]
    main_text = original
    changes = []
    if main_text is None or not main_text.strip():
        main_text = _containerd_default_config(module)
    main_data = ctd.parse(main_text, path)
    version = ctd.containerd_version(main_data, path)
    start = drop_in_text
    if start is None or not start.strip():
        start = ctd.drop_in_base(main_data, version, path, drop_in)
    inherited = ctd.effective_runc(main_data, version, path, drop_in)
    edit = ctd.edit_containerd(start, drop_in, inherited_runc=inherited, **args)
    if edit.config_version != version:
        module.fail_json(
            msg=f"{drop_in} declares config version {edit.config_version} but {path} has version {version}; "
            "containerd reads a drop-in with the main file's version, so they must agree.",
            **result,
        )
    _report(result, edit)
    # The drop-in is written before the import that makes containerd read it: a failure between the two
    # leaves the main file as it was (the drop-in is not read yet) rather than a main file whose import is
    # there before its file. Either state loads; the next run completes the change.
    changes.append(Change(drop_in, drop_in_text, edit.text))
    if not ctd.covers(main_data.get("imports"), path, drop_in):
        new_main, _changed = ctd.ensure_import(main_text, path, ctd.drop_in_import(drop_in))
        changes.append(Change(path, original, new_main))
    return changes


def _containerd_rancher(module, result, path, generated, main_data, program, args):
    """A config k3s or RKE2 generated (its first line says so): a drop-in where it imports one, else the template.

    k3s v1.33.10, v1.34.6, v1.35.3, v1.36.0 and later (and the RKE2 releases built on them) write ``imports``
    of ``config-v3.toml.d/*.toml`` (``config.toml.d/*.toml`` for the version 2 template) into the config
    they generate; older releases import nothing, and since they rewrite the file at every start, their
    template is the only place that lasts. The generated file itself is never written.
    """
    params = module.params
    mode = params["config_mode"]
    imports = main_data.get("imports")
    if mode == "file":
        module.fail_json(
            msg=f"{path} is generated by {program} at every start (its first line says so), so an edit there would "
            "be lost; use config_mode auto, drop_in or template.",
            **result,
        )
    if mode == "auto":
        mode = "drop_in" if ctd.imports_directory(imports, path) else "template"
    if mode == "template":
        return _containerd_template(module, result, path, generated, args)
    result["config_mode"] = "drop_in"
    drop_in = params["drop_in_path"] or ctd.drop_in_default(imports, path)
    result["config_path"] = drop_in
    if not ctd.covers(imports, path, drop_in):
        module.fail_json(
            msg=f"{path} is generated by {program} and does not import {drop_in} ({program} releases before "
            "v1.33.10, v1.34.6, v1.35.3 and v1.36.0 import no drop-ins); use config_mode template.",
            **result,
        )
    version = ctd.containerd_version(main_data, path)
    drop_in_text = _read(module, drop_in)
    changes = []
    if args["state"] == "absent":
        if drop_in_text is not None:
            edit = ctd.edit_containerd(drop_in_text, drop_in, **args)
            _report(result, edit)
            changes.append(Change(drop_in, drop_in_text, None))
        else:
            result.update(runtime_entry=None, default_runtime="runc")
    else:
        start = drop_in_text if drop_in_text and drop_in_text.strip() else ctd.rancher_drop_in_text(version)
        inherited = ctd.effective_runc(main_data, version, path, drop_in)
        edit = ctd.edit_containerd(start, drop_in, inherited_runc=inherited, **args)
        _report(result, edit)
        changes.append(Change(drop_in, drop_in_text, edit.text))
    # A template block of ours from before k3s imported drop-ins goes (after the drop-in is written).
    template = params["template_path"] or os.path.join(os.path.dirname(path), ctd.template_name(version))
    current = _read(module, template)
    if current is not None and ctd.split_template(current)[1] is not None:
        kept = ctd.template_text(current, None)
        changes.append(Change(template, current, None if kept.strip() == ctd.TEMPLATE_BASE else kept))
    return changes


def _containerd_template(module, result, path, generated, args):
    result["config_mode"] = "template"
    if generated is None or not generated.strip():
        module.fail_json(
            msg=f"{path} does not exist yet; start k3s or RKE2 once so that it generates its containerd config, "
            "then run this again.",
            **result,
        )
    template = module.params["template_path"] or ctd.template_path_for(generated, path)
    current = _read(module, template)
    template, edit = ctd.edit_template(generated, current, path, template, **args)
    result["config_path"] = template
    _report(result, edit)
    return [Change(template, current, edit.text)]


def _crio_files(directory):
    """Every file under ``directory`` in the order CRI-O reads them (Go's filepath.Walk: lexical, depth first)."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return
    for name in names:
        entry = os.path.join(directory, name)
        if os.path.isdir(entry) and not os.path.islink(entry):
            yield from _crio_files(entry)
        else:
            yield entry


def _crio_neighbours(module, path):
    """The other files CRI-O reads, parsed, split into those read before ``path`` and those read after it.

    ``path`` in a drop-in directory (``crio.conf.d``): the main file beside it (``crio.conf``) and the
    directory's other files; ``path`` a main file: the files of ``<path>.d``.
    """
    path = os.path.abspath(path)
    directory = os.path.dirname(path)
    if directory.endswith(".d"):
        main, drop_ins = directory[:-2], directory
    else:
        main, drop_ins = path, path + ".d"
    order = ([main] if os.path.isfile(main) else []) + list(_crio_files(drop_ins))
    if path not in order:
        order.append(path)
        # filepath.Walk's order: by the path's components, so a directory comes before a file whose name extends it.
        order.sort(key=lambda p: (p != main, tuple(os.path.relpath(p, drop_ins).split(os.sep))))
    at = order.index(path)
    parsed = []
    for other in order:
        data = {}
        if other != path:
            try:
                data = tt.loads(read_text(other) or "")
            except (OSError, UnicodeDecodeError, tt.TomlTextError) as exc:
                # Its runtimes and default cannot be checked against the entry written here; only removing ours goes on.
                if module.params["state"] == "present":
                    raise ConfigError(
                        f"{other} could not be parsed as TOML: {exc}; CRI-O reads it with {path} and would not start, "
                        "so nothing was written."
                    ) from None
                module.warn(f"{other} could not be read as TOML ({exc}); CRI-O will not start with it either.")
        parsed.append((other, data))
    return parsed[:at], parsed[at + 1 :]


def _report(result, edit):
    result["runtime_entry"] = edit.runtime_entry
    result["default_runtime"] = edit.default_runtime
    result["adopted"] = edit.adopted
    if edit.config_version is not None:
        result["config_version"] = edit.config_version
    result["notes"] = edit.notes


def _in_drop_in_dir(path):
    """Whether PATH lies in a drop-in directory (its name ends in .d, as crio.conf.d does)."""
    return os.path.basename(os.path.dirname(os.path.abspath(path))).endswith(".d")


def run_module(module):
    params = module.params
    runtime = params["runtime"]
    path = params["config_path"] or DEFAULT_PATHS[runtime]
    name = params["runtime_name"]
    state = params["state"]

    if runtime in ("containerd", "crio") and not HAS_TOML_PARSER:
        module.fail_json(msg=missing_required_lib("tomli (Python older than 3.11 has no tomllib)"))
    if not name or any(c in name for c in "\n\r\"'\\"):
        module.fail_json(msg="runtime_name must be a non-empty name without quotes, backslashes or newlines.")
    if runtime != "containerd" and params["config_mode"] not in ("auto", "file"):
        module.fail_json(msg=f"config_mode {params['config_mode']} applies to containerd only.")

    result = {"changed": False, "config_path": path, "adopted": []}
    changes = []
    try:
        if runtime == "containerd":
            changes = _containerd(module, result)
        elif runtime == "crio":
            original = _read(module, path)
            before, after = _crio_neighbours(module, path)
            edit = edit_crio(original or "", path, before=before, after=after, **_edit_args(params))
            _report(result, edit)
            new_text = None if original is None and state == "absent" else edit.text
            # A drop-in that absent leaves with nothing in it (the file present created) goes.
            if state == "absent" and new_text is not None and not new_text.strip() and _in_drop_in_dir(path):
                new_text = None
            changes = [Change(path, original, new_text)]
        else:
            original = _read(module, path)
            state_path = path + DOCKER_STATE_SUFFIX
            state_doc_before = _read_state_doc(module, state_path)
            edit = edit_docker(original or "", path, state_doc=state_doc_before, **_edit_args(params))
            _report(result, edit)
            new_text = None if original is None and state == "absent" else edit.text
            state_text = json.dumps(edit.state_doc, indent=2, sort_keys=True) + "\n" if edit.state_doc else None
            state_before = json.dumps(state_doc_before, indent=2, sort_keys=True) + "\n" if state_doc_before else None
            changes = [Change(path, original, new_text)]
            if edit.state_doc != state_doc_before:
                changes.append(Change(state_path, state_before, state_text, 0o600))
    except ConfigError as exc:
        module.fail_json(msg=str(exc), **result)

    for note in result.pop("notes", []):
        module.warn(note)
    for item in result.get("adopted", []):
        if not os.path.exists(item["to"]):
            module.warn(f"{item['entry']} now points at {item['to']}, which does not exist on this node (yet).")

    changed = [c for c in changes if c.changed]
    result["changed"] = bool(changed)
    result["changed_files"] = [c.path for c in changed]
    result["removed_files"] = [c.path for c in changed if c.after is None]
    # After the run (in check mode: after the run it would make).
    ending = {c.path: c.after is not None for c in changed}
    result["config_exists"] = ending.get(result["config_path"], os.path.exists(result["config_path"]))
    if module._diff:
        shown = [c for c in changed if not c.path.endswith(DOCKER_STATE_SUFFIX)]
        diffs = [file_diff(c.path, c.before, c.after) for c in shown]
        if not diffs and changes:  # nothing changes: the file as it is, on both sides
            diffs = [file_diff(changes[0].path, changes[0].before, changes[0].before)]
        result["diff"] = diffs[0] if len(diffs) == 1 else diffs
    if module.check_mode or not changed:
        module.exit_json(**result)

    for change in changed:
        try:
            if change.after is None:
                remove_file(change.path)
                continue
            if module.params["backup"] and change.before is not None and not change.path.endswith(DOCKER_STATE_SUFFIX):
                result["backup_file"] = backup_file(module, change.path)
            write_atomic(module, change.path, change.after, change.mode)
        except OSError as exc:
            module.fail_json(msg=f"Cannot write {change.path}: {exc}.", **result)
    module.exit_json(**result)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            runtime=dict(type="str", required=True, choices=["containerd", "docker", "crio"]),
            config_path=dict(type="path"),
            config_mode=dict(type="str", default="auto", choices=["auto", "file", "drop_in", "template"]),
            drop_in_path=dict(type="path"),
            template_path=dict(type="path"),
            runtime_name=dict(type="str", default="nvidia"),
            runtime_path=dict(type="path", default="/usr/bin/nvidia-container-runtime"),
            set_as_default=dict(type="bool", default=True),
            adopt_existing=dict(type="bool", default=True),
            enable_cdi=dict(type="bool", default=False),
            cdi_spec_dirs=dict(type="list", elements="path", default=["/etc/cdi", "/var/run/cdi"]),
            state=dict(type="str", default="present", choices=["present", "absent"]),
            backup=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    run_or_fail(module, "nvidia_runtime", run_module)


if __name__ == "__main__":
    main()
