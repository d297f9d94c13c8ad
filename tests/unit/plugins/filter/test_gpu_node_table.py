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
