"""Two CDI specs for the same GPUs, compared aspect by aspect: the one NVIDIA's `nvidia-ctk cdi generate` writes
(the container_toolkit role installs it at /var/run/cdi/nvidia.yaml) and a per-claim spec of the collection's DRA
driver. Each aspect is reduced to one line in which what necessarily differs (claim UIDs, UUIDs, the driver
version) is written as a placeholder, so that the lines can be compared with each other and with the table of
docs/compared-cdi.md, which names every difference and its reason. A difference that appears, disappears or
changes without the table following makes the test fail."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parents[2] / "docs" / "compared-cdi.md"
TABLE_HEADING = "## Differences, as the e2e tier checks them"
ASPECTS = (
    "kind",
    "cdiVersion",
    "device names",
    "a GPU's device node",
    "a GPU's own env",
    "control device nodes",
    "env",
    "hooks",
    "mounts",
    "annotations",
)
_UUID = re.compile(r"^(GPU|MIG)-[0-9a-fA-F-]+$")
_CLAIM_DEVICE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}-.+$")


def _name_kind(name: str) -> str:
    if name.isdigit():
        return "<index>"
    if _UUID.match(name):
        return "<UUID>"
    if _CLAIM_DEVICE.match(name):
        return "<claim UID>-<device>"
    return name


def _placeholders(text: str, uuids: list[str], driver_version: str) -> str:
    text = text.replace(",".join(uuids), "<UUIDs>")
    for uuid in uuids:
        text = text.replace(uuid, "<UUID>")
    return text.replace(driver_version, "<version>")


def _device_node(node: dict[str, Any]) -> str:
    return ", ".join(f"{key}={node[key]}" if key == "permissions" else key for key in sorted(node))


def aspects(spec: dict[str, Any], uuid_device: dict[str, str], driver_version: str) -> dict[str, str]:
    """One line per aspect. `uuid_device` maps each GPU UUID of the comparison to that GPU's device name in the
    spec; `driver_version` is replaced by a placeholder."""
    uuids = list(uuid_device)
    devices = {device["name"]: device.get("containerEdits") or {} for device in spec.get("devices") or []}
    common = spec.get("containerEdits") or {}
    first = devices[uuid_device[uuids[0]]]

    def clean(text: str) -> str:
        return _placeholders(text, uuids, driver_version)

    hooks = [" ".join([hook["hookName"], *hook.get("args", [])[:2]]) for hook in common.get("hooks") or []]
    return {
        "kind": spec["kind"],
        "cdiVersion": spec["cdiVersion"],
        "device names": ", ".join(dict.fromkeys(_name_kind(name) for name in devices)),
        "a GPU's device node": "; ".join(_device_node(node) for node in first.get("deviceNodes") or []) or "none",
        "a GPU's own env": clean(", ".join(first.get("env") or [])) or "none",
        "control device nodes": ", ".join(sorted(node["path"] for node in common.get("deviceNodes") or [])) or "none",
        "env": clean(", ".join(sorted(common.get("env") or []))) or "none",
        "hooks": "; ".join(hooks) or "none",
        "mounts": clean(", ".join(mount["containerPath"] for mount in common.get("mounts") or [])) or "none",
        "annotations": ", ".join(sorted(spec.get("annotations") or {})) or "none",
    }


def gpu_nodes(spec: dict[str, Any], device: str) -> list[str]:
    """The device node paths a device of the spec brings."""
    edits = next(d.get("containerEdits") or {} for d in spec["devices"] if d["name"] == device)
    return [node["path"] for node in edits.get("deviceNodes") or []]


def documented() -> dict[str, tuple[str, str]]:
    """aspect -> (nvidia-ctk, ours) from the table under TABLE_HEADING in docs/compared-cdi.md; a cell's text is
    what stands between its backticks."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split(TABLE_HEADING, 1)[1].split("\n## ", 1)[0]
    rows: dict[str, tuple[str, str]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        aspect, nvidia, ours = (cell.strip("`") for cell in cells[:3])
        rows[aspect] = (nvidia, ours)
    return rows


def differences(nvidia: dict[str, str], ours: dict[str, str]) -> dict[str, tuple[str, str]]:
    return {aspect: (nvidia[aspect], ours[aspect]) for aspect in ASPECTS if nvidia[aspect] != ours[aspect]}
