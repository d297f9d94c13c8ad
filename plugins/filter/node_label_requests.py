# Copyright: gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function


DOCUMENTATION = r"""
name: node_label_requests
short_description: The input of gpuops.k8s.node_labels for a batch of hosts, read from their host variables
version_added: 0.1.0
description:
  - Takes a list of inventory host names and reads, for each, what only that host can say from O(hostvars) -
    its Node name, its GPU facts (a registered M(gpuops.k8s.nvidia_gpu_info) result) and its label, taint and
    API settings. It returns the O(gpuops.k8s.node_labels#module:nodes) list for one run of
    M(gpuops.k8s.node_labels), so a whole batch is labelled by one task on one host, with no task per host.
  - A setting a host does not have among its host variables (inventory, facts, registered results) is taken
    from O(defaults), the values the calling task sees (the role's defaults, play and role variables). For
    C(sharing), a host without its own C(gpu_node_labels_sharing) whose own C(device_plugin_config) has a
    C(sharing) section gets that section.
  - The GPU facts are the host's result registered as O(discovered_var) when that is given and the task ran on
    the host, or else the host's variable named by O(gpu_info_var). A host with neither is listed in
    RV(_value.no_facts).
  - A host whose C(gpu_node_labels_state) is C(absent) (its own, else the C(state) of O(defaults)) gets the entry
    an entry with its C(name) and C(state=absent), which takes off what the collection applied; it needs no GPU facts.
  - For C(mig_strategy), a host without its own C(gpu_node_labels_mig_strategy) whose own C(device_plugin_config)
    has C(flags.migStrategy) gets that strategy.
  - The labels the role C(gpuops.k8s.nvidia_mig) noted for a host in this play, its fact C(nvidia_mig_node_labels)
    with C(nvidia.com/mig.config) and C(nvidia.com/mig.config.state), are added to the host's user labels, which
    win over them. A host without that fact (the MIG stage did not run in this play, as with
    C(--tags labels)) that names a MIG config (its own C(nvidia_mig_config_name) or C(gpu_mig_config), else the
    C(mig_config) of O(defaults)) keeps the node's current values of those two labels (C(keep_labels)); a host
    that names none has them removed.
options:
  _input:
    description: The inventory names of the batch's hosts.
    type: list
    elements: str
    required: true
  hostvars:
    description: The magic variable C(hostvars).
    type: dict
    required: true
  defaults:
    description:
      - The values for settings a host does not set itself, under the role's variable names without the
        C(gpu_node_labels_) prefix (C(state), C(user_labels), C(sharing), C(mig_strategy), C(taint), C(taint_key),
        C(taint_value), C(taint_effect), C(delegate_to), C(kubeconfig), C(context), C(api_host), C(api_key),
        C(validate_certs)), and C(mig_config), the MIG config name of hosts that do not set their own.
    type: dict
    required: true
  caller:
    description:
      - The inventory name of the host that runs the task, whose own settings are what O(defaults) holds where it
        sets them itself (inventory, facts). A setting that host sets itself is its own, never the others'; hosts
        without their own take it from O(role_defaults) instead.
    type: str
  role_defaults:
    description:
      - The role's own defaults under their full variable names (C(gpu_node_labels_taint), ...), for the settings
        O(caller) sets itself. C(sharing), C(mig_strategy) and C(mig_config) are not taken from here; the caller
        passes in O(defaults) what hosts without their own get.
    type: dict
    default: {}
  gpu_info_var:
    description:
      - The host variable that holds the host's M(gpuops.k8s.nvidia_gpu_info) result, for hosts that do not
        name one themselves in their own C(gpu_node_labels_gpu_info_var).
    type: str
    default: gpu_node_labels_gpu_info
  discovered_var:
    description:
      - The name under which a discovery task registered its result on the hosts, used first where that task
        ran (not skipped, not failed). Without it only O(gpu_info_var) is read.
    type: str
"""

EXAMPLES = r"""
- name: Label every GPU node of the inventory from the control host, with the facts site.yml registered
  gpuops.k8s.node_labels:
    nodes: "{{ (groups['gpu_nodes'] | gpuops.k8s.node_label_requests(hostvars, {}, gpu_info_var=facts)).nodes }}"
  vars:
    facts: gpuops_gpu_info
"""

RETURN = r"""
_value:
  description: The batch's requests and what is wrong with it.
  type: dict
  contains:
    nodes:
      description: One entry per host with GPU facts, in the form O(gpuops.k8s.node_labels#module:nodes) takes.
      type: list
      elements: dict
    no_facts:
      description: The hosts that have no GPU facts (neither a discovery result nor O(gpu_info_var)).
      type: list
      elements: str
    apis:
      description:
        - The distinct API settings (C(delegate_to), C(kubeconfig), C(context), C(api_host), C(validate_certs))
          of the batch's hosts. One batch is one module run, so a usable batch has exactly one.
        - The bearer token itself is never in the result, so that no fact or job event can show it. Each entry
          says C(api_key_sha256), the SHA-256 of the token (empty when none is set), by which hosts with
          different tokens are told apart, and C(api_key_from), the first host whose own
          C(gpu_node_labels_api_key) holds it (empty when the hosts set none, and the role's value applies);
          the task that calls the API reads the token from that host's variables.
        - The rest of the connection (C(gpu_node_labels_k8s_options), proxy, impersonation and the like, which
          may hold credentials) is not in the result either. C(k8s_options_sha256) tells hosts with different
          options apart, and C(k8s_options_from) names the first host whose own C(gpu_node_labels_k8s_options)
          holds them (empty where the role's value applies).
      type: list
      elements: dict
"""

import hashlib
import json

from ansible.errors import AnsibleFilterError

PREFIX = "gpu_node_labels_"
_LABEL_SETTINGS = ("user_labels", "sharing", "mig_strategy", "taint", "taint_key", "taint_value", "taint_effect")
_API_SETTINGS = ("delegate_to", "kubeconfig", "context", "api_host", "validate_certs")
_API_KEY = PREFIX + "api_key"
# The settings whose defaults the calling host's own values must not give the other hosts (sharing, mig_strategy and
# mig_config: the caller works that out itself, from the device-plugin and MIG settings too).
_K8S_OPTIONS = PREFIX + "k8s_options"
_OWN_SETTINGS = (
    "state",
    "user_labels",
    "taint",
    "taint_key",
    "taint_value",
    "taint_effect",
    *_API_SETTINGS,
    "api_key",
    "k8s_options",
)
_DEVICE_PLUGIN_CONFIG = "device_plugin_config"
# Labels another role of the collection decided for the host in this play, as a fact of the host.
_MIG_ROLE_LABELS = "nvidia_mig_node_labels"
_ROLE_LABELS = (_MIG_ROLE_LABELS,)
# The MIG labels that role owns, and the host variables that name the host's MIG config (the role's, the user's).
_MIG_CONFIG_LABELS = ["nvidia.com/mig.config", "nvidia.com/mig.config.state"]
_MIG_CONFIG_VARS = ("nvidia_mig_config_name", "gpu_mig_config")


def _mig_config(own, defaults):
    """The MIG config name the host names (its own variables first), or ''."""
    for name in _MIG_CONFIG_VARS:
        if name in own:
            return own[name] or ""
    return defaults.get("mig_config") or ""


def _usable(result):
    """A registered nvidia_gpu_info result that ran and did not fail."""
    return isinstance(result, dict) and bool(result) and not result.get("skipped") and not result.get("failed")


def node_label_requests(
    hosts,
    hostvars,
    defaults,
    gpu_info_var="gpu_node_labels_gpu_info",
    discovered_var=None,
    caller=None,
    role_defaults=None,
):
    if not isinstance(hosts, (list, tuple)):
        raise AnsibleFilterError("node_label_requests: the input must be a list of inventory host names.")
    if not isinstance(defaults, dict):
        raise AnsibleFilterError("node_label_requests: defaults must be a dict of the role's settings.")
    role_defaults = role_defaults or {}
    if caller is not None and caller in hostvars:
        # What the calling host sets itself is that host's, not the batch's: the others get the role's default.
        calling = hostvars[caller]
        defaults = dict(defaults)
        for name in _OWN_SETTINGS:
            if PREFIX + name in calling:
                if PREFIX + name not in role_defaults:
                    raise AnsibleFilterError(f"node_label_requests: role_defaults has no {PREFIX}{name}.")
                defaults[name] = role_defaults[PREFIX + name]
    nodes, no_facts, apis = [], [], []
    for host in hosts:
        if host not in hostvars:
            raise AnsibleFilterError(f"node_label_requests: {host} is not a host of the inventory.")
        # One read of the host's variables, then plain lookups in it.
        own = hostvars[host]

        def setting(name, own=own):
            key = PREFIX + name
            return own[key] if key in own else defaults.get(name)

        state = setting("state") or "present"
        if state not in ("present", "absent"):
            raise AnsibleFilterError(f"node_label_requests: {host}'s gpu_node_labels_state must be present or absent.")
        if state == "absent":
            # What the collection applied comes off; nothing is computed, so no GPU facts are needed.
            nodes.append({"name": own.get(PREFIX + "node_name", host), "state": "absent"})
            _add_api(host, own, setting, apis)
            continue
        gpu_info = own.get(discovered_var) if discovered_var else None
        if not _usable(gpu_info):
            gpu_info = own.get(own.get(PREFIX + "gpu_info_var", gpu_info_var))
        if not _usable(gpu_info):
            no_facts.append(host)
            continue
        node = {"name": own.get(PREFIX + "node_name", host), "gpu_info": gpu_info}
        node.update((name, setting(name)) for name in _LABEL_SETTINGS)
        role_labels = {}
        for name in _ROLE_LABELS:
            if isinstance(own.get(name), dict):
                role_labels.update(own[name])
        if role_labels:
            node["user_labels"] = {**role_labels, **(node["user_labels"] or {})}
        if not isinstance(own.get(_MIG_ROLE_LABELS), dict) and _mig_config(own, defaults):
            # The MIG stage did not run in this play: the node's MIG config labels are still its layout's.
            node["keep_labels"] = list(_MIG_CONFIG_LABELS)
        plugin_config = own.get(_DEVICE_PLUGIN_CONFIG)
        if PREFIX + "sharing" not in own and isinstance(plugin_config, dict) and "sharing" in plugin_config:
            # The labels follow the host's own device-plugin config, which shares its GPUs that way.
            node["sharing"] = plugin_config["sharing"]
        plugin_flags = plugin_config.get("flags") if isinstance(plugin_config, dict) else None
        if PREFIX + "mig_strategy" not in own and isinstance(plugin_flags, dict) and "migStrategy" in plugin_flags:
            # And its MIG strategy: the devices it serves are what the MIG labels describe.
            node["mig_strategy"] = plugin_flags["migStrategy"]
        nodes.append(node)
        _add_api(host, own, setting, apis)
    return {"nodes": nodes, "no_facts": no_facts, "apis": apis}


def _add_api(host, own, setting, apis):
    """Adds the host's API settings to apis unless a host before it reaches the API the same way."""
    api = {name: setting(name) for name in _API_SETTINGS}
    token = setting("api_key") or ""
    api["api_key_sha256"] = hashlib.sha256(token.encode("utf-8")).hexdigest() if token else ""
    options = setting("k8s_options") or {}
    if not isinstance(options, dict):
        raise AnsibleFilterError(
            f"node_label_requests: {host}'s gpu_node_labels_k8s_options must be a dict of connection options."
        )
    given = json.dumps(options, sort_keys=True, default=str) if options else ""
    api["k8s_options_sha256"] = hashlib.sha256(given.encode("utf-8")).hexdigest() if given else ""
    if not any(all(known[k] == v for k, v in api.items()) for known in apis):
        api["api_key_from"] = host if token and _API_KEY in own else ""
        api["k8s_options_from"] = host if options and _K8S_OPTIONS in own else ""
        apis.append(api)


class FilterModule:
    def filters(self):
        return {"node_label_requests": node_label_requests}
