# Copyright: gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The labels and GPU taint the collection wants on a Node, and the one merge patch that gets it there.

One source for the filters gpuops.k8s.gpu_labels and gpuops.k8s.node_label_patch (on the controller) and
the module gpuops.k8s.node_labels (wherever the Kubernetes API is reached from). Errors are LabelError, a
ValueError with one sentence; the filters turn it into AnsibleFilterError.
"""

from __future__ import absolute_import, division, print_function


import re

from ansible_collections.gpuops.k8s.plugins.module_utils._gpu_discovery import gpu_architecture
from ansible_collections.gpuops.k8s.plugins.module_utils._k8s_nodes import Conflict, with_precondition


class LabelError(ValueError):
    """A label, a GPU fact or a Node object the labels cannot be computed from."""


_LABEL_VALUE_MAX = 63
_INVALID_VALUE_CHARS = re.compile(r"[^A-Za-z0-9_.-]")
_EDGE = re.compile(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$")
_LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def sanitize_label_value(value):
    """Make any string a valid Kubernetes label value: spaces and other characters become '-'."""
    text = _INVALID_VALUE_CHARS.sub("-", str(value).strip())
    text = _EDGE.sub("", text[:_LABEL_VALUE_MAX])
    return text


def gpu_family(compute_capability):
    """Architecture family for a "MAJOR.MINOR" compute capability; 'undefined' when unknown.

    The table is the GPU facts' own (module_utils/_gpu_discovery.py), so a label and a fact never disagree.
    """
    _split_version(compute_capability, 2, "compute_capability")
    return gpu_architecture(compute_capability)


def validate_label_key(key):
    """Raise unless key is a valid label key ([prefix/]name)."""
    if not isinstance(key, str) or not key:
        raise LabelError(f"gpu_labels: label key {key!r} is not a non-empty string.")
    prefix, _slash, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        raise LabelError(f"gpu_labels: label key {key!r} has an invalid prefix {prefix!r} (a DNS subdomain is needed).")
    if not _LABEL_NAME.match(name):
        raise LabelError(
            f"gpu_labels: label key {key!r} has an invalid name {name!r} (at most 63 characters of [A-Za-z0-9_.-], "
            "starting and ending with an alphanumeric character)."
        )


def _split_version(text, parts, what):
    pieces = str(text).strip().split(".")
    try:
        numbers = [int(p) for p in pieces[:parts]]
    except ValueError:
        raise LabelError(f"gpu_labels: {what} {text!r} is not a dotted version of numbers.") from None
    if len(numbers) < parts:
        raise LabelError(f"gpu_labels: {what} {text!r} needs {parts} dotted parts.")
    return numbers


_GFD_PRODUCT_DROPPED = re.compile(r"[^A-Za-z0-9_. -]")
_SHARED_RESOURCE = "nvidia.com/gpu"


def gfd_product_name(*parts):
    """A product label value as GPU Feature Discovery spells it: each part loses every character but
    [A-Za-z0-9_. -], its runs of spaces become one '-', and the parts are joined with '-'. Then it is made a
    valid label value (GFD does not check length or edges; the API server would refuse such a value)."""
    cleaned = ["-".join(_GFD_PRODUCT_DROPPED.sub("", str(part)).split()) for part in parts]
    return sanitize_label_value("-".join(part for part in cleaned if part))


def _time_slicing(sharing, resource=_SHARED_RESOURCE):
    """(replicas of each device of the resource, whether shared devices are renamed) from the device plugin's
    `sharing` section (NVIDIA's config, version v1). Only timeSlicing exists for the collection's plugin."""
    if sharing in (None, {}):
        return 1, False
    where = "gpu_labels: sharing"
    if not isinstance(sharing, dict):
        raise LabelError(
            f"{where} must be the sharing section of the device plugin's config (a dict), not {sharing!r}."
        )
    unknown = sorted(set(sharing) - {"timeSlicing"})
    if unknown:
        raise LabelError(
            f"{where} has {', '.join(unknown)}; only timeSlicing is supported (the collection's device plugin does "
            "not run MPS)."
        )
    slicing = sharing.get("timeSlicing") or {}
    resources = slicing.get("resources") if isinstance(slicing, dict) else None
    if not isinstance(resources, list) or not all(isinstance(r, dict) for r in resources):
        raise LabelError(f"{where}.timeSlicing.resources must be a list of resources (name, replicas).")
    rename_by_default = slicing.get("renameByDefault", False)
    if not isinstance(rename_by_default, bool):
        raise LabelError(f"{where}.timeSlicing.renameByDefault must be true or false, not {rename_by_default!r}.")
    for position, entry in enumerate(resources):
        replicas = entry.get("replicas")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
            raise LabelError(
                f"{where}.timeSlicing.resources[{position}].replicas must be a whole number of at least 1, "
                f"not {replicas!r}."
            )
        if entry.get("name") == resource:
            # As in GFD, a rename of the resource shows in the product label only through renameByDefault.
            return replicas, rename_by_default
    return 1, False


# PCI classes, compared whole as GFD does: a VGA controller is in graphics mode, a 3D controller in compute mode.
_GPU_MODES = {0x030000: "graphics", 0x030200: "compute"}
_MIG_MODES = ("enabled", "disabled", "unsupported")


def _gpu_mode(gpus, pci_devices):
    """GFD's nvidia.com/gpu.mode: the mode of the PCI class all GPUs share, 'unknown' when they do not share one,
    or a GPU is not among the PCI devices read from sysfs. None (no label) when the facts hold no PCI devices at
    all: nothing was read to say which mode, and facts read through NVML on a machine whose sysfs shows no NVIDIA
    device (a lab node) must not say 'unknown' about a node another reading labelled 'compute'."""
    if not pci_devices:
        return None
    classes = {}
    for device in pci_devices or []:
        if isinstance(device, dict) and device.get("bus_id"):
            classes[str(device["bus_id"]).lower()] = device.get("class")
    seen = set()
    for gpu in gpus:
        try:
            seen.add(int(str(classes[str(gpu.get("pci_bus_id")).lower()]), 16))
        except (KeyError, ValueError):
            return "unknown"
    return _GPU_MODES.get(seen.pop(), "unknown") if len(seen) == 1 else "unknown"


MIG_STRATEGIES = ("none", "single", "mixed")
# A MIG device's attributes in the facts (nvidia_gpu_info), under the label suffix GPU Feature Discovery gives them.
_MIG_ATTRIBUTE_LABELS = (
    ("multiprocessors", "multiprocessors"),
    ("slices.gi", "gpu_instance_slices"),
    ("slices.ci", "compute_instance_slices"),
    ("engines.copy", "copy_engines"),
    ("engines.decoder", "decoders"),
    ("engines.encoder", "encoders"),
    ("engines.jpeg", "jpeg_engines"),
    ("engines.ofa", "ofa_engines"),
)


def _mig_profiles(gpus):
    """The node's MIG devices by profile, as GPU Feature Discovery names a profile in labels and resources ('+'
    becomes '.': 1g.10gb+me is 1g.10gb.me): name -> (the first device's GPU, the first device, how many)."""
    profiles = {}
    for gpu in gpus:
        if gpu.get("mig_mode") != "enabled":
            continue
        for mig in gpu.get("mig_devices") or []:
            if not isinstance(mig, dict) or mig.get("profile") in (None, "") or mig.get("memory_mib") is None:
                raise LabelError(
                    f"gpu_labels: a MIG device of GPU {gpu.get('index', 0)} in the nvidia_gpu_info result has no "
                    "profile or memory_mib."
                )
            name = str(mig["profile"]).replace("+", ".")
            first_gpu, first, count = profiles.get(name, (gpu, mig, 0))
            profiles[name] = (first_gpu, first, count + 1)
    return profiles


def _mig_resource_labels(prefix, profile, found, sharing):
    """GFD's labels of one MIG resource (prefix nvidia.com/mig-<profile>, or nvidia.com/gpu in single strategy):
    product, count, replicas, sharing strategy, memory, and the attributes NVML gives the profile's first device."""
    gpu, mig, count = found
    replicas, renamed = _time_slicing(sharing, prefix)
    shared = replicas > 1
    labels = {
        prefix + ".product": gfd_product_name(gpu["name"], "MIG", profile, "SHARED" if shared and not renamed else ""),
        prefix + ".count": str(count),
        prefix + ".replicas": str(replicas),
        prefix + ".sharing-strategy": "time-slicing" if shared else "none",
        prefix + ".memory": str(int(mig["memory_mib"])),
    }
    for suffix, fact in _MIG_ATTRIBUTE_LABELS:
        if mig.get(fact) is not None:
            labels[f"{prefix}.{suffix}"] = str(int(mig[fact]))
    return labels


def _mig_strategy_labels(gpus, strategy, sharing):
    """The labels GPU Feature Discovery adds for the device plugin's MIG strategy (none: no label).

    mixed: nvidia.com/mig-<profile>.* per MIG profile on the node. single: the one profile's labels under
    nvidia.com/gpu (its devices are the node's nvidia.com/gpu), or, when the node is not all MIG devices of one
    profile (a GPU not in MIG mode, one in MIG mode without devices, several profiles), GFD's INVALID labels."""
    if strategy == "none":
        return {}
    labels = {"nvidia.com/mig.strategy": strategy}
    profiles = _mig_profiles(gpus)
    if strategy == "mixed":
        for profile, found in profiles.items():
            labels.update(_mig_resource_labels(f"nvidia.com/mig-{profile}", profile, found, sharing))
        return labels
    in_mig_mode = [gpu for gpu in gpus if gpu.get("mig_mode") == "enabled"]
    if not in_mig_mode:
        return labels
    if len(in_mig_mode) != len(gpus) or not all(gpu.get("mig_devices") for gpu in in_mig_mode) or len(profiles) != 1:
        labels.update(
            {
                "nvidia.com/gpu.product": gfd_product_name(in_mig_mode[0]["name"], "MIG", "INVALID"),
                "nvidia.com/gpu.count": "0",
                "nvidia.com/gpu.replicas": "0",
                "nvidia.com/gpu.sharing-strategy": "",
                "nvidia.com/gpu.memory": "0",
            }
        )
        return labels
    profile, found = next(iter(profiles.items()))  # the one profile (a node of several is labelled INVALID above)
    labels.update(_mig_resource_labels(_SHARED_RESOURCE, profile, found, sharing))
    return labels


def gpu_labels(gpu_info, user_labels=None, sharing=None, mig_strategy=None):
    if not isinstance(gpu_info, dict):
        raise LabelError(
            f"gpu_labels: the input must be the result of nvidia_gpu_info (a dict), got {type(gpu_info).__name__}."
        )
    user_labels = user_labels or {}
    if not isinstance(user_labels, dict):
        raise LabelError("gpu_labels: user_labels must be a dict of label key to value.")
    replicas, renamed = _time_slicing(sharing)
    mig_strategy = mig_strategy or "none"
    if mig_strategy not in MIG_STRATEGIES:
        raise LabelError(
            f"gpu_labels: mig_strategy must be one of {', '.join(MIG_STRATEGIES)} (the device plugin's "
            f"flags.migStrategy), not {mig_strategy!r}."
        )
    gpus = gpu_info.get("gpus") or []
    labels = {}
    if gpus:
        # As GFD: a whole GPU is described when the node has one (a GPU in MIG mode only when all are), and
        # the count is of the GPUs of that model. Of several models GFD picks any; this takes the lowest index.
        first = ([gpu for gpu in gpus if gpu.get("mig_mode") != "enabled"] or gpus)[0]
        for field in ("name", "memory_total_mib", "compute_capability"):
            if first.get(field) in (None, ""):
                raise LabelError(
                    f"gpu_labels: GPU {first.get('index', 0)} in the nvidia_gpu_info result has no {field}."
                )
        same_model = [gpu for gpu in gpus if gpu.get("name") == first["name"]]
        if all(gpu.get("mig_mode") == "enabled" for gpu in same_model):
            # GFD: a model whose GPUs are all in MIG mode is not shared (its MIG devices are the resources).
            replicas, renamed = 0, False
        shared = replicas > 1
        cc_major, cc_minor = _split_version(first["compute_capability"], 2, "compute_capability")
        labels.update(
            {
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": gfd_product_name(first["name"], "SHARED" if shared and not renamed else ""),
                "nvidia.com/gpu.count": str(len(same_model)),
                "nvidia.com/gpu.memory": str(int(first["memory_total_mib"])),
                "nvidia.com/gpu.family": gpu_family(first["compute_capability"]),
                "nvidia.com/gpu.compute.major": str(cc_major),
                "nvidia.com/gpu.compute.minor": str(cc_minor),
                "nvidia.com/gpu.replicas": str(replicas),
                "nvidia.com/gpu.sharing-strategy": "time-slicing" if shared else "none",
            }
        )
        mode = _gpu_mode(gpus, gpu_info.get("pci_devices"))
        if mode is not None:
            labels["nvidia.com/gpu.mode"] = mode
        mig_modes = [gpu.get("mig_mode") for gpu in gpus]
        if all(mode in _MIG_MODES for mode in mig_modes):
            # As GFD: capable when any GPU answers for its MIG mode (NVML says NOT_SUPPORTED for the others).
            labels["nvidia.com/mig.capable"] = "true" if any(m != "unsupported" for m in mig_modes) else "false"
        driver = gpu_info.get("driver_version")
        if driver:
            pieces = str(driver).strip().split(".")
            if len(pieces) < 2 or not all(p.isdigit() for p in pieces):
                raise LabelError(f"gpu_labels: driver_version {driver!r} is not MAJOR.MINOR[.REV].")
            rev = pieces[2] if len(pieces) > 2 else ""
            labels.update(
                {
                    "nvidia.com/cuda.driver-version.full": sanitize_label_value(driver),
                    "nvidia.com/cuda.driver-version.major": pieces[0],
                    "nvidia.com/cuda.driver-version.minor": pieces[1],
                    "nvidia.com/cuda.driver-version.revision": rev,
                    "nvidia.com/cuda.driver.major": pieces[0],
                    "nvidia.com/cuda.driver.minor": pieces[1],
                    "nvidia.com/cuda.driver.rev": rev,
                }
            )
        labels.update(_mig_strategy_labels(gpus, mig_strategy, sharing))
        cuda = gpu_info.get("cuda_driver_version")
        if cuda:
            major, minor = _split_version(cuda, 2, "cuda_driver_version")
            labels.update(
                {
                    "nvidia.com/cuda.runtime-version.full": f"{major}.{minor}",
                    "nvidia.com/cuda.runtime-version.major": str(major),
                    "nvidia.com/cuda.runtime-version.minor": str(minor),
                    "nvidia.com/cuda.runtime.major": str(major),
                    "nvidia.com/cuda.runtime.minor": str(minor),
                }
            )
    for key, value in user_labels.items():
        validate_label_key(key)
        if isinstance(value, bool):
            value = "true" if value else "false"
        labels[key] = sanitize_label_value("" if value is None else value)
    return labels


OWNED_LABELS_ANNOTATION = "gpuops.k8s/owned-labels"
OWNED_TAINT_ANNOTATION = "gpuops.k8s/owned-taint"


def _taint_id(key, value, effect):
    return f"{key}={value}:{effect}"


def node_label_patch(
    node, labels, taint=True, taint_key="nvidia.com/gpu", taint_value="present", taint_effect="NoSchedule"
):
    if not isinstance(node, dict) or not isinstance(node.get("metadata"), dict):
        raise LabelError(f"node_label_patch: the input must be a Node object with metadata, got {type(node).__name__}.")
    if not isinstance(labels, dict):
        raise LabelError("node_label_patch: labels must be a dict of label key to value.")
    metadata = node["metadata"]
    current = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    owned_before = [k for k in (annotations.get(OWNED_LABELS_ANNOTATION) or "").split(",") if k]

    label_patch = {}
    for key, value in labels.items():
        if current.get(key) != str(value):
            label_patch[key] = str(value)
    for key in owned_before:
        if key not in labels and key in current:
            label_patch[key] = None

    annotation_patch = {}
    owned_now = ",".join(sorted(labels))
    if (annotations.get(OWNED_LABELS_ANNOTATION) or "") != owned_now:
        annotation_patch[OWNED_LABELS_ANNOTATION] = owned_now or None

    taints = list((node.get("spec") or {}).get("taints") or [])
    wanted = {"key": taint_key, "value": taint_value, "effect": taint_effect}
    ours = _taint_id(taint_key, taint_value, taint_effect)
    owned_taint = annotations.get(OWNED_TAINT_ANNOTATION)
    taint_patch = None
    if taint:
        present = any(
            t.get("key") == taint_key and t.get("effect") == taint_effect and (t.get("value") or "") == taint_value
            for t in taints
        )
        if not present:
            # One taint per key and effect: a same-key taint with another value is replaced, not doubled.
            taint_patch = [t for t in taints if not (t.get("key") == taint_key and t.get("effect") == taint_effect)] + [
                wanted
            ]
        if owned_taint != ours:
            annotation_patch[OWNED_TAINT_ANNOTATION] = ours
    elif owned_taint:
        key, _eq, rest = owned_taint.partition("=")
        value, _colon, effect = rest.rpartition(":")
        kept = [
            t
            for t in taints
            if not (t.get("key") == key and t.get("effect") == effect and (t.get("value") or "") == value)
        ]
        if len(kept) != len(taints):
            taint_patch = kept
        annotation_patch[OWNED_TAINT_ANNOTATION] = None

    patch = {}
    if label_patch or annotation_patch:
        patch["metadata"] = {}
        if label_patch:
            patch["metadata"]["labels"] = label_patch
        if annotation_patch:
            patch["metadata"]["annotations"] = annotation_patch
    if taint_patch is not None:
        # A merge patch replaces the whole list; null removes the field when no taint is left.
        patch["spec"] = {"taints": taint_patch or None}
    return patch


def _view(node):
    """What a diff shows of a Node: its labels, the collection's annotations and its taints."""
    metadata = node.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    return {
        "labels": dict(sorted((metadata.get("labels") or {}).items())),
        "annotations": {k: v for k, v in sorted(annotations.items()) if k.startswith("gpuops.k8s/")},
        "taints": list((node.get("spec") or {}).get("taints") or []),
    }


_TAINT_ARGS = ("taint", "taint_key", "taint_value", "taint_effect")


def label_batch(requests, api, check_mode=False, conflict_retries=5, before_write=None):
    """Bring every requested Node to its wanted labels and GPU taint with one LIST and one PATCH per node.

    requests: dicts with name, state, gpu_info, user_labels, sharing, mig_strategy, keep_labels, taint, taint_key,
    taint_value, taint_effect. state absent takes off what the collection applied (its owned labels and taint, and
    their annotations) and reads nothing else of the request. keep_labels names labels the request does not decide:
    the Node's current value of each is kept (and stays the collection's), a label the Node does not have is not
    added.
    api: an object with list_nodes() -> [node dict], read_node(name) -> node dict or None, and
    patch_node(name, merge_patch) -> the patched node dict, raising Conflict on HTTP 409.
    before_write: called once between the LIST and the first PATCH (tests use it to write in that window).

    Returns a dict: changed (name -> the patch written, or that would be in check mode), missing (names the
    API has no Node for), invalid (name -> sentence), conflicts (how many writes were refused and redone
    from a fresh read), diff (name -> before/after views of the changed nodes).
    """
    nodes = {}
    for node in api.list_nodes():
        nodes[node["metadata"]["name"]] = node
    result = {"changed": {}, "missing": [], "invalid": {}, "conflicts": 0, "diff": {}}
    pending = []
    for request in requests:
        name = request["name"]
        if request.get("state", "present") not in ("present", "absent"):
            result["invalid"][name] = f"node_labels: state must be present or absent, got {request.get('state')!r}."
            continue
        try:
            if request.get("state") == "absent":
                # Nothing wanted and no taint: node_label_patch removes the owned labels, the owned taint and
                # both ownership annotations, and nothing it does not own. A Node that is not there has none.
                if name in nodes:
                    pending.append((name, {}, (), {"taint": False}, True))
                continue
            wanted = gpu_labels(
                request.get("gpu_info") or {},
                request.get("user_labels"),
                request.get("sharing"),
                request.get("mig_strategy"),
            )
            keep = _kept_label_keys(request.get("keep_labels"))
        except LabelError as error:
            result["invalid"][name] = str(error)
            continue
        if name not in nodes:
            result["missing"].append(name)
            continue
        # What the request leaves out takes node_label_patch's defaults, the one place they are written.
        taint_args = {k: request[k] for k in _TAINT_ARGS if request.get(k) is not None}
        pending.append((name, wanted, keep, taint_args, False))
    if before_write is not None:
        before_write()
    for name, wanted, keep, taint_args, leaving in pending:
        written = _write(api, name, nodes[name], (wanted, keep), taint_args, check_mode, conflict_retries, result)
        if written is None:
            if not leaving:  # a Node that went away has nothing of the collection's left
                result["missing"].append(name)
            continue
        patch, before, node = written
        if patch:
            result["changed"][name] = patch
            after = _apply_view(before, patch) if check_mode else _view(node)
            result["diff"][name] = {"before": _view(before), "after": after}
        nodes[name] = node
    return result


def _kept_label_keys(keep):
    """The label keys a request keeps at the Node's values, checked."""
    if keep is None:
        return ()
    if not isinstance(keep, (list, tuple)):
        raise LabelError("node_labels: keep_labels must be a list of label keys.")
    for key in keep:
        validate_label_key(key)
    return tuple(keep)


def _with_kept(wanted, keep, node):
    """The wanted labels, plus the Node's current value of each kept label the request does not decide."""
    if not keep:
        return wanted
    current = (node.get("metadata") or {}).get("labels") or {}
    kept = {key: current[key] for key in keep if key not in wanted and key in current}
    return {**wanted, **kept} if kept else wanted


def _write(api, name, node, wanted_and_kept, taint_args, check_mode, conflict_retries, result):
    """One node's patch, written with its precondition and redone from a fresh read on a conflict.

    Returns (the patch computed last, the node it was computed from, the node as written) or None when the
    Node went away."""
    wanted, keep = wanted_and_kept
    for _attempt in range(conflict_retries + 1):
        patch = node_label_patch(node, _with_kept(wanted, keep, node), **taint_args)
        if not patch or check_mode:
            return patch, node, node
        try:
            return patch, node, api.patch_node(name, with_precondition(patch, node))
        except Conflict:
            result["conflicts"] += 1
            node = api.read_node(name)
            if node is None:
                return None
    raise LabelError(
        f"node_labels: the Node {name} changed between every read and write ({conflict_retries + 1} tries); "
        "something else is writing it all the time."
    )


def _apply_view(node, patch):
    """The diff view of a Node after a merge patch, without the API server (check mode)."""
    view = _view(node)
    metadata = patch.get("metadata") or {}
    for key, value in (metadata.get("labels") or {}).items():
        if value is None:
            view["labels"].pop(key, None)
        else:
            view["labels"][key] = value
    view["labels"] = dict(sorted(view["labels"].items()))
    for key, value in (metadata.get("annotations") or {}).items():
        if value is None:
            view["annotations"].pop(key, None)
        else:
            view["annotations"][key] = value
    if "spec" in patch:
        view["taints"] = list(patch["spec"].get("taints") or [])
    return view
