# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""What every containerd edit agrees on: config versions, where the CRI plugin keeps runtimes, the entry (private).

The main-file edit (``_runtime_containerd``), the drop-ins (``_runtime_containerd_dropin``) and the
k3s/RKE2 templates (``_runtime_containerd_rancher``) all read the config version the same way, look for
runtimes under the same CRI plugin table, and write the nvidia entry in the same shape: that is here.
"""

from __future__ import annotations

import json

from ansible_collections.gpuops.k8s.plugins.module_utils._runtime_config import ConfigError, TomlEdit, cdi_dirs

RUNC_SHIM = "io.containerd.runc.v2"
# Version 4 (containerd 2.2 and later) moved the server settings into plugins; the CRI sections are version 3's.
CRI_PLUGIN = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime", 4: "io.containerd.cri.v1.runtime"}
MINIMAL_CONTAINERD_CONFIG = "version = 2\n"


def parse(text, source):
    """Plain data of a containerd config, or ConfigError with one sentence."""
    return TomlEdit(text, source).before


def containerd_version(data, source):
    """The config version of a parsed containerd config (2, 3 or 4), or ConfigError with one sentence."""
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


def cri_parts(version):
    """The key path of the table that holds ``runtimes`` and ``default_runtime_name`` in that version."""
    return ("plugins", CRI_PLUGIN[version], "containerd")


def cdi_parts(version):
    # containerd 1.7 reads enable_cdi and cdi_spec_dirs in the CRI plugin's own table; 2.x in the
    # runtime part of the CRI plugin.
    return ("plugins", CRI_PLUGIN[version])


def binary_of(entry):
    """The BinaryName a runtime entry runs (None when it names none)."""
    options = entry.get("options") if isinstance(entry.get("options"), dict) else {}
    return options.get("BinaryName")


class Plan:
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


def new_entry(runc, runtime_path):
    """The nvidia entry: runc's fields and options (so GPU pods behave like every other pod), our binary."""
    entry = {"runtime_type": RUNC_SHIM}
    for key, value in runc.items():
        if key not in ("runtime_type", "options"):
            entry[key] = value
    options = {key: value for key, value in (runc.get("options") or {}).items() if key != "BinaryName"}
    options["BinaryName"] = runtime_path
    entry["options"] = options
    return entry
