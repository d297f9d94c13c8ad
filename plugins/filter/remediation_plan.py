# Copyright: gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function


DOCUMENTATION = r"""
name: remediation_plan
short_description: What playbooks/remediate.yml does on each node, the circuit breaker's decision included
version_added: 0.1.0
description:
  - Takes what the C(gpu_remediation) role read on every node of the play (its M(gpuops.k8s.gpu_faults) result, its
    node-local record of past remediations and its boot ID) and the cluster's Nodes as the API server has them, and
    decides, in one place for the whole fleet, what each node does.
  - A node whose GPUs need no more than leaving scheduling (class C(none) or C(device)) does nothing. A node with a
    GPU of class C(reset), C(reboot) or C(replace) is a candidate. A GPU that fails again within O(repeat_window) of
    a remediation that made it healthy goes to C(replace). A C(reset) becomes a C(reboot) where the node cannot
    reset (the daemon runs from a DaemonSet, or a GPU has no known UUID).
  - The circuit breaker. A node under remediation carries the taint C(nvidia.com/gpu-remediation=<class>). Every
    Node of the cluster with that taint holds one of O(max_nodes) slots, whether it is in the play or not (a node
    that never came back from its reboot keeps its slot). A candidate already carrying the taint continues where it
    was and needs no new slot. New candidates take the free slots, the most severe class first, then by node name;
    the others wait, each with a sentence that says why, and are left untouched.
  - A node under remediation as C(replace) is held for a person, and nothing is done until the taint is removed.
  - A node another run holds (its annotation names a run other than O(run_id), held until after O(now)) is left to
    that run (action C(other_run)). The breaker's decision here is the plan; M(gpuops.k8s.node_remediation) enforces
    it again when it taints, counting under a Lease.
  - A node under C(reset) whose annotation and record name no GPU is rebooted instead. A node whose record says its
    GPUs were verified healthy and whose giving back failed continues with giving it back (C(release_only)).
options:
  _input:
    description:
      - One entry per node of the play, each with C(host) (the inventory name), C(node) (the Kubernetes Node name),
        C(faults) (the M(gpuops.k8s.gpu_faults) result), C(record) (the text of the node-local record, or null),
        C(boot_id) (the node's boot ID now), and optionally C(can_reset) (false where the node cannot reset a GPU)
        with C(reset_note), the reason. Two entries naming one Node are refused, as each host acts on its own Node only.
    type: list
    elements: dict
    required: true
  cluster:
    description: The cluster's Nodes as M(kubernetes.core.k8s_info) returns them (C(resources)).
    type: list
    elements: dict
    required: true
  max_nodes:
    description:
      - How many nodes may be under remediation at once across the fleet, a count (C(0) pauses every new
        remediation) or a percentage of O(fleet_size) such as C(25%), rounded down but at least 1.
    type: raw
    default: 1
  fleet_size:
    description: The number of nodes a percentage of O(max_nodes) is taken of; never fewer than the nodes given.
    type: int
    default: 0
  repeat_window:
    description:
      - A GPU that fails again this long after a remediation made it healthy goes to C(replace). Seconds, or a
        duration such as C(24h), C(90m), C(7d), C(1d12h).
    type: raw
    default: 24h
  now:
    description: The time now, ISO 8601 in UTC (the control host's C(now(utc=True))).
    type: str
    required: true
  taint_key:
    description: The key of the taint that marks a node under remediation.
    type: str
    default: nvidia.com/gpu-remediation
  run_id:
    description: The identity of this run, as M(gpuops.k8s.node_remediation) records it on the Nodes it holds.
    type: str
    default: ""
"""

EXAMPLES = r"""
- name: Decide what every node does
  ansible.builtin.set_fact:
    plan: >-
      {{ ansible_play_hosts | map('extract', hostvars, 'remediation_input') | list
         | gpuops.k8s.remediation_plan(nodes_info.resources, max_nodes='25%', fleet_size=groups['gpu_nodes'] | length,
                                       now=now(utc=true).isoformat()) }}
  run_once: true
"""

RETURN = r"""
_value:
  description: The plan.
  type: dict
  contains:
    limit:
      description: How many nodes may be under remediation at once.
      type: int
    limit_text:
      description: How the limit was reached (C(1), C(25% of 8 nodes = 2)).
      type: str
    in_flight:
      description:
        - The nodes under remediation before this run (C(node), C(class), C(since), C(in_play)), from the API server.
      type: list
      elements: dict
    started:
      description: The nodes that take a free slot in this run.
      type: list
      elements: str
    waiting:
      description: The nodes that wait for a slot.
      type: list
      elements: str
    nodes:
      description:
        - One entry per node given, in the order given, with C(host), C(node), C(action) (C(none), C(remediate),
          C(wait) or C(hold)), C(class) (C(reset), C(reboot) or C(replace); C(none) where nothing is done),
          C(continuing), C(gpus) (the GPUs acted on, each with C(uuid), C(index), C(class) and C(reason)),
          C(release_only) (the GPUs were healthy after the remediation already, only the giving back is left),
          C(held_by) (the run that holds the node, for C(other_run)),
          C(reboot_done) (a reboot this remediation asked for has happened already), C(since), C(reasons),
          C(refused) (why the node is left untouched, where its report has a class outside C(none), C(device),
          C(reset), C(reboot), C(replace) or a GPU UUID not of NVML's shape),
          C(record) (the node-local record, parsed; C({}) where there is none or it is unreadable),
          C(capacity) (the GPU resources the Node advertised when its remediation began, C(nvidia.com/...) name to
          count as the Node's status.capacity gives it, less those it offers none of (a count of 0, or nothing of
          it allocatable, as for a plugin that stopped serving it); read from the Node for a remediation that
          starts, kept from the record for one that continues, so that a layout the remediation lost is not taken
          for the Node's) and C(message), one paragraph for the play's output.
      type: list
      elements: dict
    summary:
      description: One sentence on the slots, who started and who waits.
      type: str
"""

import json
import math
import re

from ansible.errors import AnsibleFilterError
from ansible_collections.gpuops.k8s.plugins.module_utils._node_remediation import parse_time

CLASSES = ("none", "device", "reset", "reboot", "replace")
ACTING = ("reset", "reboot", "replace")
TAINT_KEY = "nvidia.com/gpu-remediation"
ANNOTATION = "gpuops.k8s/gpu-remediation"
_RANK = {name: rank for rank, name in enumerate(CLASSES)}
_DURATION = re.compile(r"^(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
_UNIT_SECONDS = (7 * 86400, 86400, 3600, 60, 1)
# A GPU's UUID as NVML gives it: GPU-<uuid>, MIG-<uuid> or MIG-GPU-<uuid>/<GPU instance>/<compute instance>.
_UUID = re.compile(r"(?:GPU|MIG)-[0-9A-Za-z][0-9A-Za-z-]{0,70}(?:/\d{1,4}/\d{1,4})?")
# The extended resources of NVIDIA's devices a Node advertises (nvidia.com/gpu, nvidia.com/mig-1g.10gb, ...), and a
# count as the Node's status gives it.
_RESOURCE = re.compile(r"nvidia\.com/[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")
_COUNT = re.compile(r"\d{1,9}")


def _rank(name):
    return _RANK.get(name, 0)


def _highest(names):
    best = "none"
    for name in names:
        if _rank(name) > _rank(best):
            best = name
    return best


def parse_max_nodes(value, fleet):
    """(limit, how it was reached) from a count or a percentage of the fleet."""
    bad = AnsibleFilterError(
        f"remediation_plan: gpu_remediation_max_nodes must be a count (0 or more) or a percentage such as '25%', "
        f"got {value!r}."
    )
    if isinstance(value, bool):
        raise bad
    if isinstance(value, int):
        if value < 0:
            raise bad
        return value, str(value)
    text = str(value).strip()
    if text.isdigit():
        return int(text), text
    found = re.fullmatch(r"(\d+(?:\.\d+)?)\s*%", text)
    if not found or float(found.group(1)) > 100:
        raise bad
    percent = float(found.group(1))
    limit = math.floor(percent * fleet / 100.0 + 1e-9)
    if percent > 0 and limit < 1:
        limit = 1
    return limit, f"{text} of {fleet} node{'s' if fleet != 1 else ''} = {limit}"


def parse_duration(value):
    """Seconds from a number of seconds or a duration such as 24h, 90m, 1d12h."""
    bad = AnsibleFilterError(
        f"remediation_plan: gpu_remediation_repeat_window must be seconds or a duration such as '24h', '90m' or "
        f"'1d12h', got {value!r}."
    )
    if isinstance(value, bool):
        raise bad
    if isinstance(value, (int, float)):
        if value < 0:
            raise bad
        return float(value)
    text = str(value).strip().lower()
    if text.isdigit():
        return float(text)
    found = _DURATION.fullmatch(text)
    if not text or not found:
        raise bad
    return float(sum(int(part) * unit for part, unit in zip(found.groups(), _UNIT_SECONDS) if part))


def parse_record(record):
    """The node-local record as a dict ({} where there is none); (record, note) with a note when unreadable."""
    if record is None or record == "":
        return {}, None
    if isinstance(record, dict):
        return record, None
    try:
        parsed = json.loads(record)
    except (TypeError, ValueError):
        return {}, "its remediation record is not JSON and is written anew"
    if not isinstance(parsed, dict):
        return {}, "its remediation record is not a JSON object and is written anew"
    return parsed, None


def _gpu_name(gpu):
    index = gpu.get("index")
    where = f"GPU {index}" if index is not None else f"the GPU at {gpu.get('pci') or 'an unknown bus'}"
    return f"{where} ({gpu['uuid']})" if gpu.get("uuid") else where


def _gpu_entry(gpu):
    return {
        "uuid": gpu.get("uuid"),
        "index": gpu.get("index"),
        "pci": gpu.get("pci"),
        "class": gpu.get("class") if gpu.get("class") in CLASSES else "device",
        "reason": gpu.get("reason") or "",
    }


def _taint(node, key):
    for taint in (node.get("spec") or {}).get("taints") or []:
        if isinstance(taint, dict) and taint.get("key") == key:
            return taint
    return None


def _annotation(node):
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION)
    try:
        parsed = json.loads(raw) if raw else {}
    except (TypeError, ValueError):
        parsed = {}
    return parsed if isinstance(parsed, dict) else {}


def _repeat(gpu, history, now, window):
    """The earlier remediation (a history entry) that made this GPU healthy within the window, if any."""
    if not gpu.get("uuid"):
        return None
    for entry in reversed(history):
        if not isinstance(entry, dict) or entry.get("result") != "healthy":
            continue
        if gpu["uuid"] not in (entry.get("gpus") or []):
            continue
        finished = parse_time(entry.get("finished"))
        if finished is not None and timedelta_seconds(now - finished) <= window:
            return entry
    return None


def timedelta_seconds(delta):
    return delta.days * 86400 + delta.seconds + delta.microseconds / 1e6


def _faults_text(gpus):
    shown = [g for g in gpus if g["class"] != "none" or g["reason"]]
    if not shown:
        return "no GPU faults"
    return "; ".join(f"{_gpu_name(g)}: {g['class']}, {g['reason'] or 'no reason given'}" for g in shown)


def _capacity(resources, allocatable=None):
    """The GPU resources of a Node's status.capacity (or of a record that kept them): name -> count, each checked;
    None where the value is not such a mapping.

    A resource the Node offers none of is left out: a count of 0, and, where the Node's status.allocatable is given,
    a resource with nothing allocatable. The kubelet keeps a resource whose plugin stopped serving it (a MIG layout
    taken away, a plugin replaced) in status.capacity with its old count for a grace period, all of it unallocatable,
    and then at 0 for good: it is not something the Node had to give back."""
    if not isinstance(resources, dict):
        return None
    offered = allocatable if isinstance(allocatable, dict) else None
    kept = {}
    for name, count in resources.items():
        if not (isinstance(name, str) and name.startswith("nvidia.com/")):
            continue
        if not (_RESOURCE.fullmatch(name) and isinstance(count, str) and _COUNT.fullmatch(count)):
            return None
        if int(count) == 0 or (offered is not None and str(offered.get(name, "0")).strip() in ("0", "")):
            continue
        kept[name] = count
    return kept


def _node_capacity(cluster_node):
    status = (cluster_node or {}).get("status") or {}
    return _capacity(status.get("capacity"), status.get("allocatable")) or {}


def _check_input(nodes, cluster):
    if not isinstance(nodes, list) or not all(isinstance(n, dict) for n in nodes):
        raise AnsibleFilterError("remediation_plan: the input must be a list of what the role read on each node.")
    for entry in nodes:
        missing = [key for key in ("host", "node", "faults") if key not in entry]
        if missing:
            raise AnsibleFilterError(
                f"remediation_plan: the entry of {entry.get('host') or entry.get('node') or 'a node'} lacks "
                f"{', '.join(missing)}."
            )
    named = {}
    for entry in nodes:
        if not isinstance(entry["node"], str) or not entry["node"]:
            raise AnsibleFilterError(f"remediation_plan: {entry['host']} names no Node (gpu_remediation_node_name).")
        named.setdefault(entry["node"], []).append(str(entry["host"]))
    for node, hosts in named.items():
        if len(hosts) > 1:
            raise AnsibleFilterError(
                f"remediation_plan: {', '.join(hosts)} name the same Node {node}; each host names its own Node "
                "(gpu_remediation_node_name), and none acts on another's."
            )
    if not isinstance(cluster, list) or not all(isinstance(n, dict) for n in cluster):
        raise AnsibleFilterError("remediation_plan: cluster must be the list of Nodes k8s_info returns.")


def _untrusted(entry):
    """Why what a node reported cannot be acted on (a GPU class outside the known set, a UUID not of NVML's
    shape), or None."""
    faults = entry.get("faults")
    if not isinstance(faults, dict) or not isinstance(faults.get("gpus") or [], list):
        return "its fault report is not the gpu_faults result"
    if faults.get("node_class", "none") not in CLASSES:
        return f"its fault report has the class {faults.get('node_class')!r}, not one of {', '.join(CLASSES)}"
    for gpu in faults.get("gpus") or []:
        if not isinstance(gpu, dict):
            return "its fault report lists a GPU that is not a mapping"
        if gpu.get("class", "none") not in CLASSES:
            return f"its fault report has the GPU class {gpu.get('class')!r}, not one of {', '.join(CLASSES)}"
        uuid = gpu.get("uuid")
        if uuid not in (None, "") and not (isinstance(uuid, str) and _UUID.fullmatch(uuid)):
            return f"its fault report has the GPU UUID {str(uuid)[:80]!r}, not of the shape GPU-... or MIG-..."
    return None


def _candidate(entry, cluster_node, now, window, window_text, taint_key, run_id=""):
    """What one node would do, before the breaker: its action class, GPUs, whether it continues, and why."""
    refused = _untrusted(entry)
    faults = {} if refused else entry.get("faults") or {}
    gpus = [_gpu_entry(g) for g in faults.get("gpus") or [] if isinstance(g, dict)]
    record, note = parse_record(entry.get("record"))
    history = record.get("history") if isinstance(record.get("history"), list) else []
    current = record.get("current") if isinstance(record.get("current"), dict) else {}
    reasons = [note] if note else []
    acting = [g for g in gpus if g["class"] in ACTING]
    fault_class = _highest(g["class"] for g in gpus)
    taint = _taint(cluster_node or {}, taint_key)
    plan = {
        "host": entry["host"],
        "node": entry["node"],
        "action": "none",
        "class": "none",
        "fault_class": fault_class,
        "continuing": taint is not None,
        "gpus": acting,
        "reboot_done": False,
        "release_only": False,
        "held_by": None,
        "since": None,
        "reasons": reasons,
        "faults": _faults_text(gpus),
        "record": record,
        "capacity": _node_capacity(cluster_node),
    }
    if refused:
        plan.update(gpus=[], refused=refused)
        return plan
    if taint is not None:
        annotation = _annotation(cluster_node)
        plan["since"] = annotation.get("since") or current.get("started")
        value = taint.get("value") or ""
        if value not in ACTING:
            plan.update(action="hold", **{"class": "replace"})
            reasons.append(f"it carries the taint {taint_key}={value}, which is not a class this playbook acts on")
            return plan
        if value == "replace":
            plan.update(action="hold", **{"class": "replace"})
            return plan
        held_until = parse_time(annotation.get("held_until"))
        if annotation.get("run") and annotation.get("run") != run_id and held_until is not None and held_until > now:
            plan.update(action="other_run", held_by=annotation["run"], **{"class": value})
            reasons.append(f"held until {annotation.get('held_until')}")
            return plan
        known = {g["uuid"] for g in acting if g.get("uuid")}
        by_uuid = {g["uuid"]: g for g in gpus if g.get("uuid")}
        for uuid in list(annotation.get("gpus") or []) + list(current.get("gpus") or []):
            if isinstance(uuid, str) and uuid not in known:
                known.add(uuid)
                acting.append(
                    by_uuid.get(uuid) or {"uuid": uuid, "index": None, "pci": None, "class": value, "reason": ""}
                )
        # What the Node advertised when the remediation began: a reset or a reboot half done may have lost some of it.
        kept = _capacity(current.get("capacity"))
        if kept is not None:
            plan["capacity"] = kept
        plan["class"] = _highest([value, fault_class])
        if plan["class"] != value:
            reasons.append(f"the node's faults now ask for {plan['class']}, more than the {value} it was under")
        boot_before, boot_now = current.get("boot_id"), entry.get("boot_id")
        plan["reboot_done"] = bool(
            current.get("class") == "reboot" and boot_before and boot_now and boot_before != boot_now
        )
        if current.get("verified") and current.get("class") == value == plan["class"] and fault_class not in ACTING:
            plan["release_only"] = True
    else:
        if fault_class not in ACTING:
            return plan
        plan["class"] = fault_class
        for gpu in acting:
            earlier = _repeat(gpu, history, now, window)
            if earlier is not None:
                plan["class"] = "replace"
                reasons.append(
                    f"{_gpu_name(gpu)} failed again within {window_text} of the {earlier.get('class')} "
                    f"that made it healthy at {earlier.get('finished')}"
                )
    if plan["class"] == "reset":
        if entry.get("can_reset", True) is False:
            plan["class"] = "reboot"
            reasons.append(entry.get("reset_note") or "this node cannot reset a GPU")
        elif any(not g.get("uuid") for g in acting):
            plan["class"] = "reboot"
            reasons.append("a GPU to reset has no known UUID, which the reset command needs")
        elif not acting:
            plan["class"] = "reboot"
            plan["release_only"] = False
            reasons.append("neither its annotation nor its record names a GPU to reset, so the node is rebooted")
    plan["action"] = "remediate"
    return plan


def _message(plan, limit_text, limit, taken, taint_key):
    node, klass = plan["node"], plan["class"]
    gpus = ", ".join(_gpu_name(g) for g in plan["gpus"]) or "its GPUs"
    faulty = "; ".join(f"{_gpu_name(g)}: {g['reason']}" if g.get("reason") else _gpu_name(g) for g in plan["gpus"])
    why = "".join(f"; {reason}" for reason in plan["reasons"])
    if plan.get("refused"):
        return f"{node}: left untouched, {plan['refused']}."
    if plan["action"] == "none":
        return f"{node}: nothing to do, no GPU needs more than leaving scheduling ({plan['faults']})."
    if plan["action"] == "hold":
        return (
            f"{node}: under remediation as replace since {plan['since'] or 'an earlier run'}{why}; it is left "
            f"cordoned for a person, and holds a remediation slot until the taint {taint_key} is removed."
        )
    if plan["action"] == "other_run":
        return (
            f"{node}: under the {klass} of run {plan['held_by']}{why}; left to that run, untouched. A later run "
            "continues it if that run has not given it back by then."
        )
    if plan["action"] == "wait":
        holders = ", ".join(f"{t['node']} ({t['class']})" for t in taken) or "none"
        return (
            f"{node}: {klass} for {faulty or gpus}{why}; waits, {len(taken)} of {limit} remediation slot(s) being "
            f"taken ({holders}; gpu_remediation_max_nodes {limit_text}). The node is left untouched; its faults stay "
            "on the node and a later run starts it once a slot is free."
        )
    if plan["continuing"] and plan["release_only"]:
        return (
            f"{node}: its GPUs were healthy after the {klass} under way since {plan['since'] or 'an earlier run'}, "
            f"and it was not given back{why}; it is checked again and given back, without another {klass}."
        )
    if plan["continuing"]:
        done = ", rebooted already" if plan["reboot_done"] else ""
        return (
            f"{node}: continues the {klass} it is under since {plan['since'] or 'an earlier run'} for {gpus}"
            f"{done}{why}."
        )
    return f"{node}: {klass} starts now for {faulty or gpus}{why}."


def remediation_plan(
    nodes, cluster, max_nodes=1, fleet_size=0, repeat_window="24h", now=None, taint_key=TAINT_KEY, run_id=""
):
    _check_input(nodes, cluster)
    moment = parse_time(now)
    if moment is None:
        raise AnsibleFilterError(f"remediation_plan: now must be an ISO 8601 time, got {now!r}.")
    window = parse_duration(repeat_window)
    try:
        fleet = max(int(fleet_size or 0), len(nodes))
    except (TypeError, ValueError):
        raise AnsibleFilterError(
            f"remediation_plan: fleet_size must be a number of nodes, got {fleet_size!r}."
        ) from None
    limit, limit_text = parse_max_nodes(max_nodes, fleet)
    by_name = {}
    for node in cluster:
        name = (node.get("metadata") or {}).get("name")
        if name:
            by_name[name] = node
    in_play = {entry["node"] for entry in nodes}
    in_flight = []
    for name in sorted(by_name):
        taint = _taint(by_name[name], taint_key)
        if taint is not None:
            in_flight.append(
                {
                    "node": name,
                    "class": taint.get("value") or "",
                    "since": _annotation(by_name[name]).get("since"),
                    "in_play": name in in_play,
                }
            )
    window_text = f"{repeat_window} s" if isinstance(repeat_window, (int, float)) else str(repeat_window).strip()
    plans = [
        _candidate(entry, by_name.get(entry["node"]), moment, window, window_text, taint_key, run_id) for entry in nodes
    ]
    taken = [dict(t) for t in in_flight]
    started, waiting = [], []
    fresh = [p for p in plans if p["action"] == "remediate" and not p["continuing"]]
    for plan in sorted(fresh, key=lambda p: (-_rank(p["class"]), p["node"])):
        if len(taken) < limit:
            taken.append({"node": plan["node"], "class": plan["class"], "since": None, "in_play": True})
            started.append(plan["node"])
        else:
            plan["action"] = "wait"
            waiting.append(plan["node"])
    for plan in plans:
        plan["message"] = _message(plan, limit_text, limit, taken, taint_key)
    away = [t for t in in_flight if not t["in_play"]]
    summary = f"Remediation slots: {len(taken)} of {limit} in use (gpu_remediation_max_nodes {limit_text})"
    if taken:
        summary += ": " + ", ".join(f"{t['node']} ({t['class']})" for t in taken)
    if away:
        summary += "; not in this run and still under remediation: " + ", ".join(
            f"{t['node']} ({t['class']}, since {t['since'] or 'unknown'})" for t in away
        )
    summary += f". Started now: {', '.join(started) or 'none'}. Waiting for a slot: {', '.join(waiting) or 'none'}."
    return {
        "limit": limit,
        "limit_text": limit_text,
        "in_flight": in_flight,
        "started": started,
        "waiting": waiting,
        "nodes": plans,
        "summary": summary,
    }


class FilterModule:
    def filters(self):
        return {"remediation_plan": remediation_plan}
