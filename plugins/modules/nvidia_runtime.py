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
  - Only the keys of the nvidia runtime and the default runtime change; every other key and every comment
    of the file stay as they were. TOML files are edited with C(tomlkit), which preserves formatting.
  - "containerd: config versions 2 and 3 (read from the file). The runtime is added under
    C(plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.<name>) (version 2) or
    C(plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.<name>) (version 3). It inherits the fields
    and C(options) of the existing C(runc) runtime (C(SystemdCgroup) and the rest), with
    C(runtime_type = \"io.containerd.runc.v2\") and C(options.BinaryName) set to O(runtime_path)."
  - When the containerd config file does not exist it is created from C(containerd config default) if the
    C(containerd) binary is on the target, or from a minimal version 2 file otherwise.
  - "Docker: C(runtimes.<name>) in C(daemon.json) with C(path) and C(args), and C(default-runtime). Key order and
    the file's indentation are kept."
  - "CRI-O: a drop-in file with C([crio.runtime.runtimes.<name>]) and C([crio.runtime] default_runtime)."
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
  - tomlkit >= 0.11 on the target (for O(runtime=containerd) and O(runtime=crio); Debian 12 C(python3-tomlkit))
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
      - When V(false), the default runtime is left as it is.
    type: bool
    default: true
  state:
    description:
      - V(present) adds the runtime (and makes it the default when O(set_as_default=true)).
      - V(absent) removes the runtime and, if it is the default, restores the default that V(present) replaced
        (the runtime's built-in default when there is no record of one).
    type: str
    choices: [present, absent]
    default: present
  backup:
    description:
      - Keep a timestamped copy of the original file when it changes.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: Computes the change and the diff without writing anything.
  diff_mode:
    support: full
    description: Returns the file's text before and after the change, with the path as header.
notes:
  - Idempotent; a second run with the same options reports no change.
  - For containerd, an existing runtime entry of the same name with C(runtime_type = "io.containerd.runc.v2") and
    the same (or no) C(BinaryName) is treated as the nvidia runtime; its C(SystemdCgroup) follows C(runc).
  - containerd 1.x serves only the runtimes a version 2 file lists. On a version 2 file that lists none, the
    module therefore lists the built-in C(runc) next to the new runtime, marked, and C(state=absent) removes it
    again while it is the only other runtime listed and unchanged.
seealso:
  - name: containerd configuration
    description: The containerd config file format (versions 2 and 3).
    link: https://github.com/containerd/containerd/blob/main/docs/cri/config.md
"""

EXAMPLES = r"""
- name: Make nvidia the default runtime of containerd
  gpuops.k8s.nvidia_runtime:
    runtime: containerd
  notify: Restart containerd

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
  description: The file that was edited.
  returned: always
  type: str
  sample: /etc/containerd/config.toml
runtime_entry:
  description:
    - The nvidia runtime's entry as the file now holds it; null when absent.
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
config_version:
  description: The containerd config version of the file.
  returned: when O(runtime=containerd)
  type: int
  sample: 2
backup_file:
  description: The backup copy of the original file.
  returned: when a backup was made
  type: str
  sample: /etc/containerd/config.toml.12345.2026-01-01@10:00:00~
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpuops.k8s.plugins.module_utils._files import (
    file_diff,
    read_text,
    remove_file,
    write_atomic,
)
from ansible_collections.gpuops.k8s.plugins.module_utils._runtime_config import (
    HAS_TOMLKIT,
    MINIMAL_CONTAINERD_CONFIG,
    TOMLKIT_IMPORT_ERROR,
    TOMLKIT_VERSION,
    ConfigError,
    edit_containerd,
    edit_crio,
    edit_docker,
    imports_overriding_cri,
    tomlkit_too_old,
)

DEFAULT_PATHS = {
    "containerd": "/etc/containerd/config.toml",
    "docker": "/etc/docker/daemon.json",
    "crio": "/etc/crio/crio.conf.d/99-nvidia.toml",
}
DOCKER_STATE_SUFFIX = ".nvidia-runtime-state"


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
    return MINIMAL_CONTAINERD_CONFIG


def _read_state_doc(module, path):
    text = read_text(path)
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        module.fail_json(
            msg=f"{path} is not valid JSON; remove it or fix it (it records the previous default runtime)."
        )
    return data if isinstance(data, dict) else None


def run_module(module):
    params = module.params
    runtime = params["runtime"]
    path = params["config_path"] or DEFAULT_PATHS[runtime]
    name = params["runtime_name"]
    runtime_path = params["runtime_path"]
    state = params["state"]

    if runtime in ("containerd", "crio"):
        if not HAS_TOMLKIT:
            module.fail_json(msg=missing_required_lib("tomlkit"), exception=TOMLKIT_IMPORT_ERROR)
        if tomlkit_too_old():
            module.fail_json(
                msg=f"tomlkit {TOMLKIT_VERSION} is too old; this module needs tomlkit 0.11 or newer on the target."
            )
    if not name or any(c in name for c in "\n\r\"'\\"):
        module.fail_json(msg="runtime_name must be a non-empty name without quotes, backslashes or newlines.")

    if os.path.isdir(path):
        module.fail_json(msg=f"config_path {path} is a directory, not a file.")
    try:
        original = read_text(path)
    except (OSError, UnicodeDecodeError) as exc:
        module.fail_json(msg=f"Cannot read {path}: {exc}.")

    result = {"changed": False, "config_path": path}
    state_path = path + DOCKER_STATE_SUFFIX
    state_doc_before = None
    try:
        if runtime == "containerd":
            start = original
            if original is None or not original.strip():
                if state == "absent":
                    start = original if original is not None else ""
                else:
                    start = _containerd_default_config(module)
            if state == "absent" and not start.strip():
                edit = None
            else:
                edit = edit_containerd(start, path, name, runtime_path, params["set_as_default"], state)
        elif runtime == "crio":
            edit = edit_crio(original or "", path, name, runtime_path, params["set_as_default"], state)
        else:
            state_doc_before = _read_state_doc(module, state_path)
            edit = edit_docker(
                original or "", path, name, runtime_path, params["set_as_default"], state, state_doc_before
            )
    except ConfigError as exc:
        module.fail_json(msg=str(exc), **result)

    if edit is None:  # absent, and there is no containerd config at all
        result.update(runtime_entry=None, default_runtime="runc")
        module.exit_json(**result)

    if runtime == "containerd" and state == "present":
        for imported in imports_overriding_cri(edit.imports, edit.config_version, path):
            module.warn(
                f"{imported} also configures the plugin io.containerd.grpc.v1.cri; containerd 1.x replaces that whole "
                f"section with the imported one, so the runtime added to {path} does not take effect there "
                f"(set config_path to {imported} instead)."
            )

    new_text = edit.text
    if original is None and state == "absent":
        new_text = None  # nothing to remove, and no file to create
    file_changed = new_text is not None and new_text != original
    state_doc_changed = runtime == "docker" and edit.state_doc != state_doc_before

    result["changed"] = file_changed or state_doc_changed
    result["runtime_entry"] = edit.runtime_entry
    result["default_runtime"] = edit.default_runtime
    if edit.config_version is not None:
        result["config_version"] = edit.config_version
    if module._diff:
        result["diff"] = file_diff(path, original, new_text if file_changed else original)

    if module.check_mode or not result["changed"]:
        module.exit_json(**result)

    try:
        if file_changed:
            if params["backup"] and original is not None:
                result["backup_file"] = module.backup_local(path)
            write_atomic(module, path, new_text)
        if state_doc_changed:
            if edit.state_doc is None:
                remove_file(state_path)
            else:
                write_atomic(module, state_path, json.dumps(edit.state_doc, indent=2, sort_keys=True) + "\n", 0o600)
    except OSError as exc:
        module.fail_json(msg=f"Cannot write {path}: {exc}.", **result)
    module.exit_json(**result)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            runtime=dict(type="str", required=True, choices=["containerd", "docker", "crio"]),
            config_path=dict(type="path"),
            runtime_name=dict(type="str", default="nvidia"),
            runtime_path=dict(type="path", default="/usr/bin/nvidia-container-runtime"),
            set_as_default=dict(type="bool", default=True),
            state=dict(type="str", default="present", choices=["present", "absent"]),
            backup=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    run_module(module)


if __name__ == "__main__":
    main()
