# Copyright: gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function


DOCUMENTATION = r"""
name: nvidia_runtime_plan
short_description: Which container runtimes of a node the nvidia_runtime role configures, and how
version_added: 0.1.0
description:
  - Takes one M(gpuops.k8s.node_state) result (the runtime binaries, the runtimes' systemd units and the
    containerd config file of the node) and the role's tables of what marks each runtime, and returns the
    role's decisions for the node.
  - A runtime is present when one of its binaries exists (by file name, in any directory that was read) or
    when systemd knows one of its units (a unit file or a loaded unit; not C(not-found)).
  - k3s and RKE2 bring their own containerd. When one of them is present, containerd counts as detected, and
    containerd is configured through it (RKE2 first, when both are there) unless O(containerd_mode) says
    otherwise.
options:
  _input:
    description: The registered result of M(gpuops.k8s.node_state), with its C(paths) and C(units).
    type: dict
    required: true
  engines:
    description: The role's C(nvidia_runtime_engines), C(auto) or a list of runtimes.
    type: raw
    default: auto
  containerd_mode:
    description: The role's C(nvidia_runtime_containerd_mode) (C(auto), C(file), C(drop_in), C(k3s), C(rke2)).
    type: str
    default: auto
  known_engines:
    description: The runtimes the role can configure, in the order it configures them.
    type: list
    elements: str
    required: true
  binaries:
    description: Runtime (C(containerd), C(docker), C(crio), C(k3s), C(rke2)) to the file name of its binary.
    type: dict
    required: true
  units:
    description: Runtime to the names of its systemd units, without C(.service).
    type: dict
    required: true
  services:
    description: Each of O(known_engines) to the name of the unit that runs it, without C(.service).
    type: dict
    required: true
"""

EXAMPLES = r"""
- name: Decide which runtimes to configure
  ansible.builtin.set_fact:
    runtime_plan: >-
      {{ node_state_result | gpuops.k8s.nvidia_runtime_plan(engines='auto',
         known_engines=['containerd', 'docker', 'crio'],
         binaries={'containerd': 'containerd', 'docker': 'dockerd', 'crio': 'crio', 'k3s': 'k3s', 'rke2': 'rke2'},
         units={'containerd': ['containerd'], 'docker': ['docker'], 'crio': ['crio'], 'k3s': ['k3s', 'k3s-agent'],
                'rke2': ['rke2-server', 'rke2-agent']},
         services={'containerd': 'containerd', 'docker': 'docker', 'crio': 'crio'}) }}
"""

RETURN = r"""
_value:
  description: The decisions for the node.
  type: dict
  contains:
    detected:
      description: The runtimes of O(known_engines) found on the node (containerd too where k3s or RKE2 is).
      type: list
      elements: str
    selected:
      description: The runtimes to configure, C(detected) when O(engines) is C(auto), else O(engines).
      type: list
      elements: str
    service_state:
      description: Each of O(known_engines) to the C(active_state) of its unit.
      type: dict
    active_units:
      description: The units read that are active now, without C(.service).
      type: list
      elements: str
    rancher:
      description: C(rke2) or C(k3s) when one is present (RKE2 first), else an empty string.
      type: str
    found_rancher:
      description: Those of C(rke2) and C(k3s) that are present.
      type: list
      elements: str
    containerd_how:
      description: O(containerd_mode) when it is not C(auto), else C(rancher) when one is present, else C(auto).
      type: str
"""

from ansible.errors import AnsibleFilterError

_RANCHER = ("rke2", "k3s")
_UNIT_SUFFIX = ".service"


def _basename(path):
    return str(path).rstrip("/").rsplit("/", 1)[-1]


def _unit_name(unit):
    return str(unit).replace(_UNIT_SUFFIX, "")


def nvidia_runtime_plan(node, known_engines, binaries, units, services, engines="auto", containerd_mode="auto"):
    if not isinstance(node, dict) or not isinstance(node.get("paths"), dict) or not isinstance(node.get("units"), dict):
        raise AnsibleFilterError(
            "nvidia_runtime_plan: the input must be a gpuops.k8s.node_state result with paths and units."
        )
    for name, table in (("binaries", binaries), ("units", units), ("services", services)):
        if not isinstance(table, dict):
            raise AnsibleFilterError(f"nvidia_runtime_plan: {name} must be a dict keyed by runtime.")
    found_files = {_basename(path) for path, state in node["paths"].items() if (state or {}).get("type") != "absent"}
    known_units = {
        _unit_name(unit) for unit, state in node["units"].items() if (state or {}).get("load_state") != "not-found"
    }
    present = [runtime for runtime, binary in binaries.items() if binary in found_files]
    for runtime, names in units.items():
        if runtime not in present and any(name in known_units for name in names):
            present.append(runtime)
    found_rancher = [runtime for runtime in _RANCHER if runtime in present]
    rancher = found_rancher[0] if found_rancher else ""
    detected = [engine for engine in known_engines if engine in present or (engine == "containerd" and rancher)]
    service_state = {}
    for engine in known_engines:
        unit = node["units"].get(f"{services.get(engine, engine)}{_UNIT_SUFFIX}")
        if isinstance(unit, dict) and "active_state" in unit:
            service_state[engine] = unit["active_state"]
    return {
        "detected": detected,
        "selected": detected if engines == "auto" else engines,
        "service_state": service_state,
        "active_units": [
            _unit_name(unit) for unit, state in node["units"].items() if (state or {}).get("active_state") == "active"
        ],
        "rancher": rancher,
        "found_rancher": found_rancher,
        "containerd_how": containerd_mode if containerd_mode != "auto" else (rancher or "auto"),
    }


class FilterModule:
    def filters(self):
        return {"nvidia_runtime_plan": nvidia_runtime_plan}
