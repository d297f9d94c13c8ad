import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.gpuops.k8s.plugins.filter.cgroup_v1_note import FilterModule, cgroup_v1_note


def test_cgroup_v2_needs_nothing():
    assert cgroup_v1_note("cgroup2fs\n", node="gpu-1", kubelet_version="v1.37.2") == ""


@pytest.mark.parametrize("version", ["v1.35.0", "v1.37.2", "v1.40.1-rc.1", "v2.0.0"])
def test_a_kubelet_that_refuses_cgroup_v1_by_default(version):
    note = cgroup_v1_note("tmpfs", node="gpu-1", kubelet_version=version)
    assert note.startswith("gpu-1: cgroup v1 (/sys/fs/cgroup is tmpfs, not cgroup2fs).")
    assert f"Its kubelet {version} starts there only because its KubeletConfiguration sets failCgroupV1: false" in note
    assert "deprecated" in note and "cgroup v2" in note


@pytest.mark.parametrize("version", ["v1.33.13", "v1.34.2", "1.29.0+k3s1"])
def test_an_older_kubelet_is_told_what_to_set_before_its_upgrade(version):
    note = cgroup_v1_note("tmpfs", node="gpu-1", kubelet_version=version)
    assert f"Its kubelet {version} runs there as it is" in note
    assert "set it before upgrading the kubelet" in note
    assert "failCgroupV1: false" in note


@pytest.mark.parametrize("version", ["", "unknown", None])
def test_an_unknown_kubelet_version_gets_the_general_rule(version):
    note = cgroup_v1_note("tmpfs", node="gpu-1", kubelet_version=version)
    assert "From Kubernetes 1.35 on the kubelet starts on cgroup v1 only when" in note
    assert "Its kubelet" not in note


@pytest.mark.parametrize("fs_type", ["", "  ", None, 3])
def test_bad_input(fs_type):
    with pytest.raises(AnsibleFilterError):
        cgroup_v1_note(fs_type, node="gpu-1")


def test_registered():
    assert FilterModule().filters()["cgroup_v1_note"] is cgroup_v1_note
