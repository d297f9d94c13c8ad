import re

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.gpuops.k8s.plugins.filter.gpu_node_table import FilterModule, gpu_node_table


def _row(node, **checks):
    base = {"driver": True, "plugin": True, "allocatable": True, "labels": True, "taint": True}
    base.update(checks)
    return {
        "node": node,
        "model": "NVIDIA H100 80GB HBM3",
        "count": 8,
        "allocatable": 8,
        "labels": "ok",
        "taint": "on",
        "plugin": "healthy",
        "checks": base,
    }


def test_header_and_sorted_rows_aligned():
    lines = gpu_node_table([_row("gpu-b"), _row("gpu-a", plugin=False, labels="False")])
    assert lines[0].split()[:3] == ["NODE", "GPU", "MODEL"]
    assert lines[1].startswith("gpu-a ")
    assert lines[1].endswith("labels, plugin")
    assert lines[2].startswith("gpu-b ")
    assert lines[2].endswith("-")
    assert lines[1].index("NVIDIA") == lines[0].index("GPU MODEL")


def test_missing_fields_are_dashes():
    lines = gpu_node_table([{"node": "x"}])
    assert lines[1].split() == ["x", "-", "-", "-", "-", "-", "-", "-"]


@pytest.mark.parametrize("rows", ["text", [1]])
def test_bad_input(rows):
    with pytest.raises(AnsibleFilterError):
        gpu_node_table(rows)


def test_registered():
    assert FilterModule().filters()["gpu_node_table"] is gpu_node_table


# DRA mode: the rows validate.yml computes for a device-plugin node, a DRA node and an unreachable node.


def _dra_row(node, **checks):
    """A DRA node with 8 GPUs: 8 devices published, 1 of them unhealthy, 2 claims prepared."""
    row = _row(node)
    row["checks"] = {"driver": True, "plugin": True, "allocatable": True, "published": True, "labels": True}
    row["checks"].update(taint=True, **checks)
    row.update(mode="dra", allocatable=0, published=8, unhealthy=1, claims=2)
    return row


def _fleet():
    plugin_node = dict(_row("gpu-node-1"), mode="device-plugin")
    unreachable = {"node": "gpu-node-3", "mode": "dra", "reason": "unreachable: ssh", "checks": {"connection": False}}
    return [unreachable, _dra_row("gpu-node-2"), plugin_node]


def test_a_fleet_with_a_dra_node_gets_the_dra_columns():
    # The lines are wider than this file's: each is cut in two after CLAIMS.
    assert gpu_node_table(_fleet()) == [
        "NODE        GPU MODEL              MODE           COUNT  ALLOCATABLE  PUBLISHED  UNHEALTHY  CLAIMS  "
        "LABELS  TAINT  PLUGIN   RED",
        "gpu-node-1  NVIDIA H100 80GB HBM3  device-plugin  8      8            -          -          -       "
        "ok      on     healthy  -",
        "gpu-node-2  NVIDIA H100 80GB HBM3  dra            8      0            8          1          2       "
        "ok      on     healthy  -",
        "gpu-node-3  -                      dra            -      -            -          -          -       "
        "-       -      -        connection",
    ]


def test_a_dra_row_reads_as_its_values_in_order():
    # What an end-to-end test can grep for a green DRA node: mode, count, allocatable, published, unhealthy,
    # claims, labels, taint, plugin, red.
    line = gpu_node_table(_fleet())[2]
    assert re.fullmatch(r"gpu-node-2\s+NVIDIA H100 80GB HBM3\s+dra\s+8\s+0\s+8\s+1\s+2\s+ok\s+on\s+healthy\s+-", line)


def test_red_follows_the_checks_not_the_unhealthy_count():
    lines = gpu_node_table([_dra_row("gpu-node-2", published=False, allocatable=False)])
    assert lines[1].endswith("healthy  allocatable, published")
    assert gpu_node_table([_dra_row("gpu-node-2")])[1].endswith("healthy  -")


def test_a_fleet_without_dra_nodes_keeps_the_table_it_had():
    rows = [dict(_row("gpu-node-1"), mode="device_plugin"), {"node": "gpu-node-3", "checks": {"connection": False}}]
    lines = gpu_node_table(rows)
    assert lines[0] == "NODE        GPU MODEL              COUNT  ALLOCATABLE  LABELS  TAINT  PLUGIN   RED"
    assert lines[1] == "gpu-node-1  NVIDIA H100 80GB HBM3  8      8            ok      on     healthy  -"
    assert re.fullmatch(r"gpu-node-3(\s+-){6}\s+connection", lines[2])


def test_a_device_plugin_node_shows_no_dra_values():
    # device_plugin (the variable's spelling) is shown as device-plugin; DRA cells it carries are ignored.
    row = dict(_row("gpu-node-1"), mode="device_plugin", published=8, unhealthy=0, claims=0)
    lines = gpu_node_table([row, _dra_row("gpu-node-2")])
    assert lines[1].split()[5:12] == ["device-plugin", "8", "8", "-", "-", "-", "ok"]


def test_a_row_without_a_mode_in_a_dra_table():
    lines = gpu_node_table([{"node": "x"}, _dra_row("y")])
    assert lines[1].split() == ["x"] + ["-"] * 11


@pytest.mark.parametrize(
    ("rows", "dra_columns", "has_mode"),
    [
        ([_row("a")], True, True),
        ([_row("a")], "yes", True),
        ([_dra_row("a")], False, False),
        ([_dra_row("a")], None, True),
        ([], None, False),
    ],
)
def test_the_dra_columns_can_be_asked_for(rows, dra_columns, has_mode):
    assert ("MODE" in gpu_node_table(rows, dra_columns=dra_columns)[0].split()) is has_mode


def test_a_non_dict_row_is_named_by_its_position():
    with pytest.raises(AnsibleFilterError, match="row 1 is not a dict"):
        gpu_node_table([_row("b"), "a"])
