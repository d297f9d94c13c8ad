# Copyright: gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function


DOCUMENTATION = r"""
name: gpu_node_table
short_description: A plain-text table of GPU node checks, one line per node
version_added: 0.1.0
description:
  - Formats the rows that C(playbooks/validate.yml) computes per node (node, GPU model, GPU count, allocatable
    C(nvidia.com/gpu), labels, taint, plugin status and the checks that are red) as aligned text lines.
  - A table with a node in DRA mode (C(mode) C(dra)) also has the columns MODE (C(device-plugin) or C(dra)),
    PUBLISHED (the devices in the node's ResourceSlices), UNHEALTHY (those of them marked C(Unhealthy)) and
    CLAIMS (the claims prepared on the node). A device-plugin node shows C(-) in the last three. A table
    without a DRA node leaves these columns out, so it reads as before DRA mode existed.
options:
  _input:
    description:
      - Rows, each a dict with C(node), C(model), C(count), C(allocatable), C(labels), C(taint), C(plugin)
        and C(checks) (check name to bool); a missing field is shown as C(-).
      - Optionally C(mode) (C(device-plugin) or C(dra); C(device_plugin) is shown as C(device-plugin)) and, for
        a DRA node, C(published), C(unhealthy) and C(claims).
    type: list
    elements: dict
    required: true
  dra_columns:
    description:
      - Whether to show the DRA columns. By default (null) they are shown when a row's C(mode) is C(dra).
    type: bool
"""

EXAMPLES = r"""
- name: Print the table
  ansible.builtin.debug:
    msg: "{{ rows | gpuops.k8s.gpu_node_table }}"
"""

RETURN = r"""
_value:
  description: The header line, then one line per row, sorted by node name.
  type: list
  elements: str
"""

from ansible.errors import AnsibleFilterError

_COLUMNS = (
    ("node", "NODE"),
    ("model", "GPU MODEL"),
    ("count", "COUNT"),
    ("allocatable", "ALLOCATABLE"),
    ("labels", "LABELS"),
    ("taint", "TAINT"),
    ("plugin", "PLUGIN"),
)
_DRA_COLUMNS = (
    ("node", "NODE"),
    ("model", "GPU MODEL"),
    ("mode", "MODE"),
    ("count", "COUNT"),
    ("allocatable", "ALLOCATABLE"),
    ("published", "PUBLISHED"),
    ("unhealthy", "UNHEALTHY"),
    ("claims", "CLAIMS"),
    ("labels", "LABELS"),
    ("taint", "TAINT"),
    ("plugin", "PLUGIN"),
)
# Cells that only a DRA node has: a device-plugin node shows "-" there whatever its row holds.
_DRA_ONLY = frozenset(("published", "unhealthy", "claims"))


def _truthy(value):
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "1", "on")
    return bool(value)


def _mode(row):
    mode = row.get("mode")
    return "-" if mode is None or str(mode).strip() == "" else str(mode).strip().replace("_", "-")


def _cells(row, columns):
    dra = _mode(row) == "dra"
    cells = []
    for key, _title in columns:
        if key == "mode":
            cells.append(_mode(row))
        elif key in _DRA_ONLY and not dra:
            cells.append("-")
        else:
            cells.append(str(row.get(key, "-")))
    red = sorted(name for name, ok in (row.get("checks") or {}).items() if not _truthy(ok))
    return (*cells, ", ".join(red) or "-")


def gpu_node_table(rows, dra_columns=None):
    if not isinstance(rows, list):
        raise AnsibleFilterError("gpu_node_table: the input must be a list of rows.")
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise AnsibleFilterError(f"gpu_node_table: row {index} is not a dict.")
    if dra_columns is None:
        dra_columns = any(_mode(row) == "dra" for row in rows)
    columns = _DRA_COLUMNS if _truthy(dra_columns) else _COLUMNS
    table = [(*(title for _key, title in columns), "RED")]
    table.extend(_cells(row, columns) for row in sorted(rows, key=lambda r: str(r.get("node", ""))))
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    return ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip() for line in table]


class FilterModule:
    def filters(self):
        return {"gpu_node_table": gpu_node_table}
