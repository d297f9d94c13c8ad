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
options:
  _input:
    description:
      - Rows, each a dict with C(node), C(model), C(count), C(allocatable), C(labels), C(taint), C(plugin)
        and C(checks) (check name to bool).
    type: list
    elements: dict
    required: true
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

_COLUMNS = ("node", "model", "count", "allocatable", "labels", "taint", "plugin")
_HEADER = ("NODE", "GPU MODEL", "COUNT", "ALLOCATABLE", "LABELS", "TAINT", "PLUGIN", "RED")


def _truthy(value):
    if isinstance(value, str):
        return value.strip().lower() in ("true", "yes", "1", "on")
    return bool(value)


def gpu_node_table(rows):
    if not isinstance(rows, list):
        raise AnsibleFilterError("gpu_node_table: the input must be a list of rows.")
    table = [_HEADER]
    for index, row in enumerate(sorted(rows, key=lambda r: str(r.get("node", "")) if isinstance(r, dict) else "")):
        if not isinstance(row, dict):
            raise AnsibleFilterError(f"gpu_node_table: row {index} is not a dict.")
        red = sorted(name for name, ok in (row.get("checks") or {}).items() if not _truthy(ok))
        table.append((*tuple(str(row.get(c, "-")) for c in _COLUMNS), ", ".join(red) or "-"))
    widths = [max(len(line[i]) for line in table) for i in range(len(_HEADER))]
    return ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(line)).rstrip() for line in table]


class FilterModule:
    def filters(self):
        return {"gpu_node_table": gpu_node_table}
