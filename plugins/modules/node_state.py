#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later


DOCUMENTATION = r"""
---
module: node_state
short_description: Read the state of a node's files, packages, systemd units and a Python environment in one call
version_added: 0.1.0
description:
  - Answers in one module run what a role would otherwise ask with a C(stat), C(slurp), C(package_facts),
    C(service_facts) or C(pip) task each, so that a role can skip the tasks whose result is already in
    place. It never changes anything.
  - >-
    Each path of O(paths) is described so that it can be compared with what a task would write, as a whole:
    C({type: absent}) when it does not exist, otherwise its C(type) (C(file), C(directory), C(link) for a
    symbolic link, which is not followed, or C(other)), C(mode) (four octal digits), C(owner) and C(group)
    (names, or numbers without a name), and for a regular file the SHA-1 C(checksum) of its content
    (unless O(checksum) is off).
author:
  - gpuops.k8s maintainers (@gpuops)
options:
  paths:
    description: Paths to describe.
    type: list
    elements: path
    default: []
  checksum:
    description: Whether the descriptions of regular files in O(paths) carry the SHA-1 C(checksum) of their content.
    type: bool
    default: true
  contents:
    description:
      - Small text files to read (at most 64 KiB each); a file that does not exist reads as C(null).
    type: list
    elements: path
    default: []
  packages:
    description:
      - Names of system packages whose installed version to report, from C(dpkg-query) on Debian-like systems
        or C(rpm) elsewhere.
    type: list
    elements: str
    default: []
  units:
    description:
      - systemd units whose state to report, all read with one C(systemctl show).
      - On a host where systemd is not running (no C(/run/systemd/system), as in many containers) nothing is asked;
        every unit is reported as C(not-found) and C(inactive), and RV(systemd) is C(false).
    type: list
    elements: str
    default: []
  python_env:
    description:
      - A Python virtual environment whose installed distributions to report (read from its
        C(lib/python*/site-packages/*.dist-info) directories).
    type: path
  python_requirements:
    description:
      - Requirements to check against O(python_env). Only exact pins (C(name==version)) can be satisfied
        by what is installed; anything else is always reported in RV(python_env.unsatisfied).
    type: list
    elements: str
    default: []
  commands:
    description:
      - Commands to run, by a name of the caller's choice; each is an argv list whose first item is an absolute
        path or a name on the node's C(PATH). Only commands that change nothing belong here (for example
        C(nvidia-ctk cdi generate), which prints a specification, or C(containerd config dump)).
      - A command whose program is not installed is reported as C(null) and not run.
    type: dict
    default: {}
  record:
    description:
      - A record of the paths a role left in place the last time it converged the node (written from
        RV(record_text)). The module describes every path the record lists again and reports in RV(record)
        whether all are as recorded, so that one read tells the role whether anything drifted.
      - A record that does not exist, or that cannot be read as one, is reported as not current.
    type: path
  record_paths:
    description:
      - Paths to describe for a new record, returned as RV(record_text) (with O(record_key)). A directory's
        description lists its entries, each regular file with its SHA-1, so a file added, removed or edited
        in it shows as a difference.
    type: list
    elements: path
    default: []
  record_key:
    description:
      - What the caller wants recorded with the paths, such as a hash of its settings; returned again as
        RV(record.key).
    type: str
    default: ""
extends_documentation_fragment:
  - gpuops.k8s.read_only
attributes:
  platform:
    platforms: posix
    support: full
    description: Linux hosts; O(units) needs systemd.
notes:
  - >-
    A role compares a path's description with the one its task would produce, for example
    C(state.paths[dest] != {'type': 'file', 'mode': '0644', 'owner': 'root', 'group': 'root',
    'checksum': content | hash('sha1')}), and runs the task only when they differ. The task then does the
    work and reports it as before, in check and diff mode too.
"""

EXAMPLES = r"""
- name: Read what the role would otherwise ask task by task
  gpuops.k8s.node_state:
    paths: [/etc/gpuops, /etc/gpuops/plugin.yaml]
    contents: [/var/lib/gpuops/allocation-mode]
    packages: [nvidia-container-toolkit]
    units: [containerd.service, gpuops-device-plugin.service]
    python_env: /opt/gpuops/venv
    python_requirements: [grpcio==1.76.0]
  register: node
  check_mode: false

- name: Write the config only where it differs
  ansible.builtin.copy:
    content: "{{ config }}"
    dest: /etc/gpuops/plugin.yaml
    owner: root
    group: root
    mode: "0644"
  when: >-
    node.paths['/etc/gpuops/plugin.yaml'] !=
    {'type': 'file', 'mode': '0644', 'owner': 'root', 'group': 'root', 'checksum': config | hash('sha1')}
"""

RETURN = r"""
paths:
  description: Path to its description (see the module's description).
  returned: always
  type: dict
  sample:
    /etc/gpuops: {type: directory, mode: "0755", owner: root, group: root}
    /etc/gpuops/plugin.yaml:
      {type: file, mode: "0644", owner: root, group: root, checksum: 3f786850e387550fdab836ed7e6dc881de23001b}
    /etc/gpuops/absent.yaml: {type: absent}
contents:
  description: Path to its text, or C(null) when the file does not exist.
  returned: always
  type: dict
packages:
  description:
    - Package name to C(version) (C(null) when not installed) and C(held) (C(true) when dpkg has it on hold;
      C(null) with rpm, which has no holds of its own).
  returned: always
  type: dict
  sample: {nvidia-container-toolkit: {version: 1.17.8-1, held: false}, absent-package: {version: null, held: false}}
units:
  description: Unit name to its C(load_state), C(active_state) and C(unit_file_state) as systemd reports them.
  returned: always
  type: dict
  sample: {containerd.service: {load_state: loaded, active_state: active, unit_file_state: enabled}}
systemd:
  description: Whether systemd runs on the host (C(/run/systemd/system) exists).
  returned: always
  type: bool
python_env:
  description: What O(python_env) holds.
  returned: when O(python_env) is set
  type: dict
  contains:
    exists:
      description: Whether the environment's C(bin/python) exists.
      type: bool
    distributions:
      description: Normalized distribution name to installed version.
      type: dict
    unsatisfied:
      description: The O(python_requirements) that what is installed does not meet.
      type: list
      elements: str
commands:
  description:
    - Name of each of O(commands) to its C(rc), C(stdout) and C(stderr), or C(null) when its program is not
      installed.
  returned: always
  type: dict
  sample: {cdi: {rc: 0, stdout: "cdiVersion: 0.5.0", stderr: ""}, missing: null}
record:
  description: What O(record) says about the node.
  returned: when O(record) is set
  type: dict
  contains:
    key:
      description: The key the record was written with; C(null) without a readable record.
      type: str
    current:
      description: Whether the record was readable and every path it lists is still as recorded.
      type: bool
    differs:
      description: The recorded paths that are not as recorded any more.
      type: list
      elements: str
record_text:
  description: The record of O(record_paths) and O(record_key), as JSON text to write where O(record) reads it.
  returned: when O(record_paths) is set
  type: str
"""

import glob
import grp
import hashlib
import os
import pwd
import re
import json
import stat

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuops.k8s.plugins.module_utils._last_resort import run_or_fail

MAX_CONTENT = 64 * 1024
_UNIT_PROPERTIES = ("Id", "LoadState", "ActiveState", "UnitFileState")
_PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([A-Za-z0-9][A-Za-z0-9.+!_-]*)\s*$")
_DIST_INFO = re.compile(r"^(?P<name>.+?)-(?P<version>[^-]+)\.dist-info$")


class StateError(Exception):
    """One sentence for fail_json."""


def normalize(name):
    """A distribution name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _name(lookup, number):
    try:
        return lookup(number)[0]
    except KeyError:
        return str(number)


def describe(path, checksum=True):
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return {"type": "absent"}
    except OSError as exc:
        raise StateError(f"cannot read {path}: {exc.strerror or exc}.") from exc
    if stat.S_ISLNK(info.st_mode):
        kind = "link"
    elif stat.S_ISDIR(info.st_mode):
        kind = "directory"
    elif stat.S_ISREG(info.st_mode):
        kind = "file"
    else:
        kind = "other"
    out = {
        "type": kind,
        "mode": f"{stat.S_IMODE(info.st_mode):04o}",
        "owner": _name(pwd.getpwuid, info.st_uid),
        "group": _name(grp.getgrgid, info.st_gid),
    }
    if kind == "file" and checksum:
        digest = hashlib.sha1()
        try:
            with open(path, "rb") as handle:
                for block in iter(lambda: handle.read(1 << 16), b""):
                    digest.update(block)
        except OSError as exc:
            raise StateError(f"cannot read {path}: {exc.strerror or exc}.") from exc
        out["checksum"] = digest.hexdigest()
    return out


def describe_for_record(path):
    """describe() with, for a directory, its entries (non-recursive): a regular file by its SHA-1, anything
    else by its type."""
    out = describe(path, checksum=True)
    if out["type"] == "directory":
        try:
            names = sorted(os.listdir(path))
        except OSError as exc:
            raise StateError(f"cannot list {path}: {exc.strerror or exc}.") from exc
        entries = {}
        for name in names:
            entry = describe(os.path.join(path, name), checksum=True)
            entries[name] = entry.get("checksum", entry["type"])
        out["entries"] = entries
    return out


def record_text(paths, key):
    return json.dumps({"key": key, "paths": {path: describe_for_record(path) for path in paths}}, sort_keys=True)


def read_record(path):
    """{key, current, differs} for the record at PATH; an unreadable record is not current."""
    text = None
    try:
        text = read_text(path)
    except StateError:
        text = None
    try:
        record = json.loads(text) if text is not None else None
    except ValueError:
        record = None
    if not isinstance(record, dict) or not isinstance(record.get("paths"), dict):
        return {"key": None, "current": False, "differs": []}
    differs = [name for name, wanted in sorted(record["paths"].items()) if describe_for_record(name) != wanted]
    key = record.get("key")
    return {"key": key if isinstance(key, str) else None, "current": not differs, "differs": differs}


def run_commands(module, commands):
    out = {}
    for name, argv in commands.items():
        if not isinstance(argv, list) or not argv or not all(isinstance(arg, str) for arg in argv):
            raise StateError(f"commands: {name} must be a list of strings (the program and its arguments).")
        program = argv[0] if os.path.isabs(argv[0]) else module.get_bin_path(argv[0])
        if not program or not os.access(program, os.X_OK):
            out[name] = None
            continue
        rc, stdout, stderr = module.run_command([program, *argv[1:]])
        out[name] = {"rc": rc, "stdout": stdout, "stderr": stderr}
    return out


def read_text(path):
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_CONTENT + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StateError(f"cannot read {path}: {exc.strerror or exc}.") from exc
    if len(data) > MAX_CONTENT:
        raise StateError(f"{path} is larger than {MAX_CONTENT} bytes; node_state reads only small files.")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise StateError(f"{path} is not UTF-8 text.") from None


def parse_dpkg(names, stdout):
    """``dpkg-query -W -f '${Package}\\t${Version}\\t${Status}\\n'`` output -> {name: {version, held}}."""
    found = {}
    for line in stdout.splitlines():
        fields = line.split("\t")
        if len(fields) != 3:
            continue
        package, version, status = fields
        want, _error, state = ([*status.split(" "), "", "", ""])[:3]
        installed = state in ("installed", "half-configured", "unpacked", "triggers-awaited", "triggers-pending")
        found[package] = {"version": version if installed and version else None, "held": want == "hold"}
    return {name: found.get(name, {"version": None, "held": False}) for name in names}


def parse_rpm(names, stdout):
    """``rpm -q --qf '%{NAME}\\t%{VERSION}-%{RELEASE}\\n'`` output -> {name: {version, held}}."""
    found = {}
    for line in stdout.splitlines():
        fields = line.split("\t")
        if len(fields) == 2:
            found[fields[0]] = fields[1]
    return {name: {"version": found.get(name), "held": None} for name in names}


def parse_systemctl_show(units, stdout):
    """``systemctl show -p Id,LoadState,ActiveState,UnitFileState U...``: one block per unit, in order."""
    blocks = [block for block in stdout.strip().split("\n\n") if block.strip()]
    if len(blocks) != len(units):
        raise StateError(f"systemctl show answered for {len(blocks)} units, not the {len(units)} asked for.")
    out = {}
    for unit, block in zip(units, blocks):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        out[unit] = {
            "load_state": props.get("LoadState", ""),
            "active_state": props.get("ActiveState", ""),
            "unit_file_state": props.get("UnitFileState", ""),
        }
    return out


def python_env(venv, requirements):
    distributions = {}
    for info in glob.glob(os.path.join(venv, "lib", "python*", "site-packages", "*.dist-info")):
        match = _DIST_INFO.match(os.path.basename(info))
        if match:
            distributions[normalize(match.group("name"))] = match.group("version")
    unsatisfied = []
    for requirement in requirements:
        pin = _PIN.match(requirement)
        if not pin or distributions.get(normalize(pin.group(1))) != pin.group(2):
            unsatisfied.append(requirement)
    return {
        "exists": os.path.exists(os.path.join(venv, "bin", "python")),
        "distributions": distributions,
        "unsatisfied": unsatisfied,
    }


def packages(module, names):
    dpkg = module.get_bin_path("dpkg-query")
    if dpkg:
        rc, out, err = module.run_command([dpkg, "-W", "-f", "${Package}\t${Version}\t${Status}\n", "--", *names])
        # 1: some of the names are not known to dpkg at all; they are reported as not installed.
        if rc not in (0, 1):
            raise StateError(f"dpkg-query failed (exit {rc}): {(err or out).strip()}")
        return parse_dpkg(names, out)
    rpm = module.get_bin_path("rpm")
    if rpm:
        rc, out, err = module.run_command([rpm, "-q", "--qf", "%{NAME}\t%{VERSION}-%{RELEASE}\n", "--", *names])
        if rc != 0 and not out:
            raise StateError(f"rpm -q failed (exit {rc}): {err.strip()}")
        return parse_rpm(names, out)
    raise StateError("neither dpkg-query nor rpm is installed, so package versions cannot be read.")


def systemd_running():
    """sd_booted(3): systemd is the init system."""
    return os.path.isdir("/run/systemd/system")


def units_state(module, units):
    if not systemd_running():
        return {unit: {"load_state": "not-found", "active_state": "inactive", "unit_file_state": ""} for unit in units}
    systemctl = module.get_bin_path("systemctl")
    if not systemctl:
        raise StateError("systemctl is not installed, so the state of {} cannot be read.".format(", ".join(units)))
    rc, out, err = module.run_command([systemctl, "show", "-p", ",".join(_UNIT_PROPERTIES), "--", *units])
    if rc != 0:
        raise StateError(f"systemctl show failed (exit {rc}): {(err or out).strip()}")
    return parse_systemctl_show(units, out)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            paths=dict(type="list", elements="path", default=[]),
            checksum=dict(type="bool", default=True),
            contents=dict(type="list", elements="path", default=[]),
            packages=dict(type="list", elements="str", default=[]),
            units=dict(type="list", elements="str", default=[]),
            python_env=dict(type="path"),
            python_requirements=dict(type="list", elements="str", default=[]),
            commands=dict(type="dict", default={}),
            record=dict(type="path"),
            record_paths=dict(type="list", elements="path", default=[]),
            record_key=dict(type="str", default="", no_log=False),
        ),
        supports_check_mode=True,
    )
    run_or_fail(module, "node_state", run_module)


def run_module(module):
    params = module.params
    try:
        result = dict(
            changed=False,
            paths={path: describe(path, params["checksum"]) for path in params["paths"]},
            contents={path: read_text(path) for path in params["contents"]},
            packages=packages(module, params["packages"]) if params["packages"] else {},
            units=units_state(module, params["units"]) if params["units"] else {},
            systemd=systemd_running(),
            commands=run_commands(module, params["commands"]),
        )
        if params["record"]:
            result["record"] = read_record(params["record"])
        if params["record_paths"]:
            result["record_text"] = record_text(params["record_paths"], params["record_key"])
        if params["python_env"]:
            result["python_env"] = python_env(params["python_env"], params["python_requirements"])
    except StateError as exc:
        module.fail_json(msg=f"node_state: {exc}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
