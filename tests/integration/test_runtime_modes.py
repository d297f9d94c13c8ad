"""The module's containerd modes and real-node layouts, judged by real containerd.

- Drop-in mode: the main file gains only an import; containerd 1.6/1.7 (which replace a whole plugin
  section with an imported one) and 2.1 (which merges key by key) load the main file's settings and
  the runtime.
- k3s/RKE2 template mode: the template the module writes is executed with Go's text/template
  (tests/integration/k3s_render, standing in for k3s's own generator) over recorded k3s/RKE2
  configs, before and after k3s finds the toolkit itself, and containerd loads the result.
- Entries the GPU Operator left, CDI, and layouts written in other syntaxes (dotted keys, inline
  tables, parents declared late, CRLF, tabs, a BOM) load in containerd with the runtime converged.
"""

from __future__ import annotations

import os
import subprocess

import pytest
from conftest import CONFIGS, built_containerd, config_dump, config_dump_with_warnings, containerd_default

RUNTIME = "/usr/bin/nvidia-container-runtime"
CRI = {2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}
K3S = CONFIGS / "k3s"


def containerd_section(dump, version):
    return dump["plugins"][CRI[version]]["containerd"]


def binaries(dump, version):
    runtimes = containerd_section(dump, version)["runtimes"]
    return {name: rt.get("options", {}).get("BinaryName") for name, rt in runtimes.items() if name.startswith("nvidia")}


@pytest.fixture(scope="session")
def containerd24():
    """The newest containerd 2.x: it imports /etc/containerd/conf.d/*.toml by itself (from 2.2 on)."""
    return built_containerd("build-containerd24.sh", " 2.4.")


# --------------------------------------------------------------------------------------- drop-ins


@pytest.mark.parametrize("peer", ["containerd16", "containerd17"])
def test_version_2_drop_in_keeps_the_main_cri_settings(peer, tmp_path, run_module, request):
    binary = request.getfixturevalue(peer)
    main = tmp_path / "config.toml"
    main.write_text((CONFIGS / "v2-mirrors-comments.toml").read_text())
    original = main.read_text()
    drop_in = tmp_path / "conf.d" / "99-nvidia.toml"
    before = config_dump(binary, main)

    checked = run_module(
        runtime="containerd", config_path=str(main), config_mode="drop_in", drop_in_path=str(drop_in), check=True
    )
    assert checked["changed"] and sorted(checked["changed_files"]) == sorted([str(main), str(drop_in)])
    assert main.read_text() == original and not drop_in.exists()
    result = run_module(runtime="containerd", config_path=str(main), config_mode="drop_in", drop_in_path=str(drop_in))
    assert result["config_mode"] == "drop_in" and result["config_path"] == str(drop_in)
    # The main file gains the import line and nothing else.
    added = [line for line in main.read_text().splitlines() if line not in original.splitlines()]
    assert added == [f'imports = ["{tmp_path / "conf.d" / "*.toml"}"]']
    again = run_module(runtime="containerd", config_path=str(main), config_mode="auto", drop_in_path=str(drop_in))
    assert again["changed"] is False and again["config_mode"] == "drop_in"

    after = config_dump(binary, main)
    cri_before, cri_after = before["plugins"][CRI[2]], after["plugins"][CRI[2]]
    assert cri_after["sandbox_image"] == cri_before["sandbox_image"]
    assert cri_after["registry"] == cri_before["registry"]
    section = containerd_section(after, 2)
    assert section["default_runtime_name"] == "nvidia"
    assert section["runtimes"]["nvidia"]["options"]["BinaryName"] == RUNTIME
    assert section["runtimes"]["nvidia"]["options"].get("SystemdCgroup") == section["runtimes"]["runc"]["options"].get(
        "SystemdCgroup"
    )
    assert section["runtimes"]["runc"] == containerd_section(before, 2)["runtimes"]["runc"]

    removed = run_module(runtime="containerd", config_path=str(main), config_mode="drop_in", drop_in_path=str(drop_in))
    assert removed["changed"] is False
    removed = run_module(
        runtime="containerd", config_path=str(main), config_mode="drop_in", drop_in_path=str(drop_in), state="absent"
    )
    assert removed["changed"] and not drop_in.exists()
    final = config_dump(binary, main)
    final.pop("imports", None)
    before.pop("imports", None)
    assert final == before


def test_version_3_drop_in_holds_only_the_runtime(tmp_path, run_module, containerd2):
    main = tmp_path / "config.toml"
    main.write_text((CONFIGS / "v3-node.toml").read_text())
    before = config_dump(containerd2, main)
    drop_in = tmp_path / "conf.d" / "99-nvidia.toml"
    run_module(
        runtime="containerd", config_path=str(main), config_mode="drop_in", drop_in_path=str(drop_in), enable_cdi=True
    )
    assert drop_in.read_text().startswith("version = 3\n")
    assert "pause:" not in drop_in.read_text()  # the sandbox image stays the main file's alone
    after, warnings = config_dump_with_warnings(containerd2, main)
    assert "unknown" not in warnings.lower(), warnings
    section = containerd_section(after, 3)
    assert section["default_runtime_name"] == "nvidia"
    assert section["runtimes"]["nvidia"]["options"]["BinaryName"] == RUNTIME
    assert section["runtimes"]["nvidia"]["options"]["SystemdCgroup"] is True  # runc's, from the main file
    assert section["runtimes"]["runc"] == containerd_section(before, 3)["runtimes"]["runc"]
    assert after["plugins"][CRI[3]]["enable_cdi"] is True


@pytest.mark.parametrize("peer", ["containerd2", "containerd24"])
@pytest.mark.parametrize("systemd", [True, False])
def test_version_3_drop_in_keeps_runcs_cgroup_driver(peer, systemd, tmp_path, run_module, request):
    """The nvidia runtime is the default: its SystemdCgroup must be runc's, or every pod of a systemd-driver
    kubelet runs with the wrong cgroup driver. A drop-in holds no runc of its own, so it takes runc's options
    from the main file (and the files imported before it)."""
    binary = request.getfixturevalue(peer)
    main = tmp_path / "config.toml"
    text = (CONFIGS / "v3-node.toml").read_text()
    main.write_text(text if systemd else text.replace("SystemdCgroup = true", "SystemdCgroup = false"))
    drop_in = tmp_path / "conf.d" / "99-nvidia.toml"
    args = dict(runtime="containerd", config_path=str(main), config_mode="drop_in", drop_in_path=str(drop_in))
    run_module(**args)
    section = containerd_section(config_dump(binary, main), 3)
    assert section["default_runtime_name"] == "nvidia"
    assert section["runtimes"]["runc"]["options"]["SystemdCgroup"] is systemd
    assert section["runtimes"]["nvidia"]["options"]["SystemdCgroup"] is systemd
    assert run_module(**args)["changed"] is False

    # runc's driver changes later in the main file: the next run follows it.
    main.write_text(
        main.read_text().replace(
            f"SystemdCgroup = {str(systemd).lower()}", f"SystemdCgroup = {str(not systemd).lower()}"
        )
    )
    assert run_module(**args)["changed"] is True
    section = containerd_section(config_dump(binary, main), 3)
    assert section["runtimes"]["nvidia"]["options"]["SystemdCgroup"] is (not systemd)
    assert run_module(**args)["changed"] is False


def test_containerd_24_default_config_takes_the_drop_in(tmp_path, run_module, containerd24):
    """containerd 2.2 and later write config version 4 and import conf.d/*.toml by default, so auto mode
    writes a drop-in on every new node: it must read version 4, keep runc's cgroup driver and write no key
    containerd 2.4 does not know (enable_cdi: CDI is always on there)."""
    main = tmp_path / "config.toml"
    conf_d = tmp_path / "conf.d"
    default = containerd_default(containerd24)
    assert default.startswith("version = 4\n") and "'/etc/containerd/conf.d/*.toml'" in default
    main.write_text(
        default.replace("/etc/containerd/conf.d", str(conf_d)).replace("SystemdCgroup = false", "SystemdCgroup = true")
    )
    original = main.read_text()
    args = dict(runtime="containerd", config_path=str(main), enable_cdi=True)
    result = run_module(**args)
    assert result["config_mode"] == "drop_in" and result["config_version"] == 4
    assert result["config_path"] == str(conf_d / "99-nvidia.toml")
    assert main.read_text() == original  # the default already imports the directory
    dump, warnings = config_dump_with_warnings(containerd24, main)
    assert "level=warning" not in warnings, warnings
    section = containerd_section(dump, 3)
    assert section["default_runtime_name"] == "nvidia"
    assert section["runtimes"]["nvidia"]["options"]["SystemdCgroup"] is True
    assert section["runtimes"]["nvidia"]["options"]["BinaryName"] == RUNTIME
    assert dump["plugins"][CRI[3]]["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]
    assert run_module(**args)["changed"] is False


# --------------------------------------------------------------------------------- k3s and RKE2


def render(k3s_render, base, template, found=(), systemd_cgroup=True):
    """k3s's next config.toml: the template executed over base, with the runtimes k3s found."""
    env = dict(os.environ, K3S_RENDER_SYSTEMD_CGROUP=str(systemd_cgroup).lower())
    proc = subprocess.run(
        [k3s_render, str(base), str(template), *found], capture_output=True, text=True, check=False, timeout=30, env=env
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


FOUND = (f"nvidia={RUNTIME}", f"nvidia-cdi={RUNTIME}.cdi")
GENERATIONS = ["k3s-v1.31.4-v2", "k3s-v1.32.3-v3", "k3s-v1.32.3-v2legacy", "k3s-v1.36-v3", "rke2-v1.32.3-v3"]


@pytest.mark.parametrize("generation", GENERATIONS)
def test_k3s_template_before_and_after_k3s_finds_the_toolkit(generation, tmp_path, run_module, request):
    base_fixture = K3S / f"{generation}-base.toml"
    nvidia_fixture = K3S / f"{generation}-nvidia.toml"
    version = 3 if "-v3" in generation else 2
    binary = request.getfixturevalue("containerd2" if version == 3 else "containerd17")
    k3s_render = request.getfixturevalue("k3s_render")
    agent = tmp_path / "agent" / "etc" / "containerd"
    agent.mkdir(parents=True)
    generated = agent / "config.toml"
    generated.write_text(base_fixture.read_text())

    result = run_module(runtime="containerd", config_path=str(generated), config_mode="template", set_as_default=False)
    template = agent / ("config-v3.toml.tmpl" if version == 3 else "config.toml.tmpl")
    assert result["changed"] and result["config_path"] == str(template)
    assert template.read_text().startswith('{{ template "base" . }}\n')

    # The next k3s start, the toolkit not found by k3s: our tables render.
    generated.write_text(render(k3s_render, base_fixture, template))
    dump = config_dump(binary, generated)
    assert binaries(dump, version) == {"nvidia": RUNTIME}
    again = run_module(runtime="containerd", config_path=str(generated), config_mode="template", set_as_default=False)
    assert again["changed"] is False

    # Later k3s finds the toolkit and renders nvidia itself: the guard keeps ours out, containerd loads.
    generated.write_text(render(k3s_render, nvidia_fixture, template, FOUND))
    dump = config_dump(binary, generated)
    assert binaries(dump, version) == {"nvidia": RUNTIME, "nvidia-cdi": RUNTIME + ".cdi"}
    assert run_module(runtime="containerd", config_path=str(generated), config_mode="template")["changed"] is False

    removed = run_module(runtime="containerd", config_path=str(generated), config_mode="template", state="absent")
    assert removed["changed"] and not template.exists()


def test_k3s_template_keeps_the_operators_own_template(tmp_path, run_module, containerd2, k3s_render):
    agent = tmp_path / "agent" / "etc" / "containerd"
    agent.mkdir(parents=True)
    generated = agent / "config.toml"
    generated.write_text((K3S / "k3s-v1.32.3-v3-base.toml").read_text())
    template = agent / "config-v3.toml.tmpl"
    own = '{{ template "base" . }}\n\n[debug]\n  level = "debug"\n'
    template.write_text(own)
    run_module(runtime="containerd", config_path=str(generated), config_mode="template", set_as_default=False)
    assert template.read_text().startswith(own)
    generated.write_text(render(k3s_render, K3S / "k3s-v1.32.3-v3-base.toml", template))
    dump = config_dump(containerd2, generated)
    assert dump["debug"]["level"] == "debug"
    assert binaries(dump, 3) == {"nvidia": RUNTIME}
    run_module(runtime="containerd", config_path=str(generated), config_mode="template", state="absent")
    assert template.read_text() == own


def test_k3s_that_found_the_operators_toolkit_is_reported(tmp_path, run_module):
    agent = tmp_path / "agent" / "etc" / "containerd"
    agent.mkdir(parents=True)
    generated = agent / "config.toml"
    generated.write_text((K3S / "k3s-v1.36-v3-nvidia-operator.toml").read_text())
    result = run_module(runtime="containerd", config_path=str(generated), config_mode="template")
    assert "k3s renders the runtime nvidia itself" in str(result.get("warnings"))
    assert "/usr/local/nvidia/toolkit/nvidia-container-runtime" in str(result.get("warnings"))


# ------------------------------------------------------------------ what the GPU Operator left


OPERATOR = {
    2: """\
version = 2
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "nvidia"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = true
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
      privileged_without_host_devices = false
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
        BinaryName = "/usr/local/nvidia/toolkit/nvidia-container-runtime"
        SystemdCgroup = true
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia-cdi]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia-cdi.options]
        BinaryName = "/usr/local/nvidia/toolkit/nvidia-container-runtime.cdi"
        SystemdCgroup = true
""",
}
OPERATOR[3] = (
    OPERATOR[2]
    .replace("version = 2", "version = 3")
    .replace('  sandbox_image = "registry.k8s.io/pause:3.10"\n', "")
    .replace("io.containerd.grpc.v1.cri", CRI[3])
)


@pytest.mark.parametrize("version", [2, 3])
def test_operator_entries_converge_to_the_host_toolkit(version, tmp_path, run_module, request):
    binary = request.getfixturevalue("containerd17" if version == 2 else "containerd2")
    path = tmp_path / "config.toml"
    path.write_text(OPERATOR[version])
    refused = run_module(
        runtime="containerd", config_path=str(path), adopt_existing=False, expect_failure=True, config_mode="file"
    )
    assert "set adopt_existing to true" in refused["msg"]
    assert path.read_text() == OPERATOR[version]
    result = run_module(runtime="containerd", config_path=str(path), enable_cdi=True)
    assert [item["to"] for item in result["adopted"]] == [RUNTIME, RUNTIME + ".cdi"]
    dump = config_dump(binary, path)
    assert binaries(dump, version) == {"nvidia": RUNTIME, "nvidia-cdi": RUNTIME + ".cdi"}
    nvidia = containerd_section(dump, version)["runtimes"]["nvidia"]
    assert nvidia["options"]["SystemdCgroup"] is True
    assert nvidia.get("privileged_without_host_devices", False) is False
    cri = dump["plugins"][CRI[version]]
    assert cri["enable_cdi"] is True and cri["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]
    assert run_module(runtime="containerd", config_path=str(path), enable_cdi=True)["changed"] is False


# ------------------------------------------------------------------------ layouts of real nodes


LAYOUTS = {
    "dotted": """version = 2
[plugins."io.containerd.grpc.v1.cri"]
sandbox_image = "registry.k8s.io/pause:3.10"
containerd.snapshotter = "overlayfs"
containerd.runtimes.runc.runtime_type = "io.containerd.runc.v2"
containerd.runtimes.runc.options.SystemdCgroup = true
""",
    "inline": """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  runtimes = { runc = { runtime_type = "io.containerd.runc.v2", options = { SystemdCgroup = true } } }
""",
    "late-parents": """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
SystemdCgroup = true
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd]
snapshotter = "overlayfs"
[plugins."io.containerd.grpc.v1.cri"]
sandbox_image = "registry.k8s.io/pause:3.10"
""",
    "crlf-tabs": 'version = 2\r\n[plugins."io.containerd.grpc.v1.cri".containerd]\r\n\tsnapshotter = "overlayfs"  \r\n'
    '\t[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\t# ünïcode ✓\r\n'
    '\t\truntime_type = "io.containerd.runc.v2"\r\n',
    "bom": '\ufeffversion = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
    'runtime_type = "io.containerd.runc.v2"\n',
}


@pytest.mark.parametrize("peer", ["containerd16", "containerd17"])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_layouts_converge_and_load(layout, peer, tmp_path, run_module, request):
    binary = request.getfixturevalue(peer)
    path = tmp_path / "config.toml"
    path.write_bytes(LAYOUTS[layout].encode())
    before = config_dump(binary, path)
    assert run_module(runtime="containerd", config_path=str(path))["changed"] is True
    assert run_module(runtime="containerd", config_path=str(path))["changed"] is False
    after = config_dump(binary, path)
    section = containerd_section(after, 2)
    assert section["default_runtime_name"] == "nvidia"
    assert section["runtimes"]["nvidia"]["options"]["BinaryName"] == RUNTIME
    assert section["runtimes"]["runc"] == containerd_section(before, 2)["runtimes"]["runc"]
    assert section["snapshotter"] == containerd_section(before, 2)["snapshotter"]
    assert run_module(runtime="containerd", config_path=str(path), state="absent")["changed"] is True
    assert config_dump(binary, path) == before


# ------------------------------------------------------- k3s and RKE2: drop-in or template, by version


def k3s_node(tmp_path, fixture, systemd=True):
    """An agent directory with the config k3s generated from ``fixture`` (its imports pointed at it)."""
    agent = tmp_path / "agent" / "etc" / "containerd"
    agent.mkdir(parents=True)
    generated = agent / "config.toml"
    text = (K3S / fixture).read_text().replace("/var/lib/rancher/k3s/agent/etc/containerd", str(agent))
    if not systemd:
        text = text.replace("SystemdCgroup = true", "SystemdCgroup = false")
    generated.write_text(text)
    return agent, generated


@pytest.mark.parametrize("peer", ["containerd2", "containerd24"])
@pytest.mark.parametrize("systemd", [True, False])
def test_k3s_that_imports_drop_ins_gets_a_drop_in(peer, systemd, tmp_path, run_module, request):
    """k3s v1.33.10/v1.34.6/v1.35.3/v1.36.0 and later import config-v3.toml.d/*.toml: auto mode writes the runtime
    there, never into the file k3s regenerates, and the runtime keeps the cgroup driver k3s gave runc."""
    binary = request.getfixturevalue(peer)
    agent, generated = k3s_node(tmp_path, "k3s-v1.36-v3-base.toml", systemd)
    original = generated.read_text()
    args = dict(runtime="containerd", config_path=str(generated), set_as_default=False)
    assert run_module(check=True, **args)["changed"] and not (agent / "config-v3.toml.d").exists()
    result = run_module(**args)
    drop_in = agent / "config-v3.toml.d" / "99-nvidia.toml"
    assert result["config_mode"] == "drop_in" and result["config_path"] == str(drop_in)
    assert result["changed_files"] == [str(drop_in)]
    assert generated.read_text() == original
    assert not (agent / "config-v3.toml.tmpl").exists()
    section = containerd_section(config_dump(binary, generated), 3)
    assert section["runtimes"]["nvidia"]["options"]["BinaryName"] == RUNTIME
    assert section["runtimes"]["nvidia"]["options"]["SystemdCgroup"] is systemd
    assert "sandbox" not in drop_in.read_text() and "pause" not in drop_in.read_text()
    assert run_module(**args)["changed"] is False
    removed = run_module(state="absent", **args)
    assert removed["changed"] and not drop_in.exists() and generated.read_text() == original


def test_k3s_before_drop_ins_gets_the_template_in_auto_mode(tmp_path, run_module):
    """Older k3s imports nothing and rewrites config.toml at every start: auto mode writes the template."""
    agent, generated = k3s_node(tmp_path, "k3s-v1.32.3-v3-base.toml")
    original = generated.read_text()
    result = run_module(runtime="containerd", config_path=str(generated), set_as_default=False)
    assert result["config_mode"] == "template" and result["config_path"] == str(agent / "config-v3.toml.tmpl")
    assert generated.read_text() == original
    refused = run_module(runtime="containerd", config_path=str(generated), config_mode="file", expect_failure=True)
    assert "generated by k3s at every start" in refused["msg"]
    refused = run_module(runtime="containerd", config_path=str(generated), config_mode="drop_in", expect_failure=True)
    assert "use config_mode template" in refused["msg"]
    assert generated.read_text() == original


def test_k3s_upgrade_to_drop_ins_moves_the_runtime_out_of_the_template(tmp_path, run_module, containerd24):
    agent, generated = k3s_node(tmp_path, "k3s-v1.32.3-v3-base.toml")
    args = dict(runtime="containerd", config_path=str(generated), set_as_default=False)
    run_module(**args)
    template = agent / "config-v3.toml.tmpl"
    assert template.exists()
    # k3s is upgraded: the next start renders the new base (with imports) through our template.
    new_base = (
        (K3S / "k3s-v1.36-v3-base.toml").read_text().replace("/var/lib/rancher/k3s/agent/etc/containerd", str(agent))
    )
    generated.write_text(new_base)
    result = run_module(**args)
    drop_in = agent / "config-v3.toml.d" / "99-nvidia.toml"
    assert result["config_mode"] == "drop_in"
    assert result["changed_files"] == [str(drop_in), str(template)]  # the drop-in first
    assert not template.exists()
    section = containerd_section(config_dump(containerd24, generated), 3)
    assert section["runtimes"]["nvidia"]["options"] == {"BinaryName": RUNTIME, "SystemdCgroup": True}
    assert run_module(**args)["changed"] is False


def test_k3s_template_follows_k3s_cgroup_driver(tmp_path, run_module, containerd2, k3s_render):
    """k3s decides runc's SystemdCgroup at every start; the template's runtime follows that decision."""
    agent, generated = k3s_node(tmp_path, "k3s-v1.32.3-v3-base.toml")
    run_module(runtime="containerd", config_path=str(generated), config_mode="template", set_as_default=False)
    template = agent / "config-v3.toml.tmpl"
    assert "SystemdCgroup = {{ $.SystemdCgroup }}" in template.read_text()
    for systemd in (True, False):
        base = tmp_path / f"base-{systemd}.toml"
        base.write_text(
            (K3S / "k3s-v1.32.3-v3-base.toml")
            .read_text()
            .replace("SystemdCgroup = true", f"SystemdCgroup = {str(systemd).lower()}")
        )
        generated.write_text(render(k3s_render, base, template, systemd_cgroup=systemd))
        runtimes = containerd_section(config_dump(containerd2, generated), 3)["runtimes"]
        assert runtimes["nvidia"]["options"]["SystemdCgroup"] is systemd
        assert (
            run_module(runtime="containerd", config_path=str(generated), config_mode="template", set_as_default=False)[
                "changed"
            ]
            is False
        )


# ------------------------------------------------------------- several files: the order of the writes


FAIL_WRITE = """
import os
from ansible_collections.gpuops.k8s.plugins.module_utils import _files

_real = _files.write_atomic


def write_atomic(module, path, text, mode_for_new=0o644):
    if path == os.environ["GPUOPS_TEST_FAIL_WRITE"]:
        raise OSError(28, "No space left on device (test double of a full disk)")
    return _real(module, path, text, mode_for_new)


_real_remove = _files.remove_file


def remove_file(path):
    if path == os.environ["GPUOPS_TEST_FAIL_WRITE"]:
        raise OSError(30, "Read-only file system (test double of a failing disk)")
    return _real_remove(path)


_files.write_atomic = write_atomic
_files.remove_file = remove_file
"""


@pytest.mark.parametrize("peer", ["containerd16", "containerd2"])
def test_a_drop_in_write_interrupted_before_the_import_leaves_a_loadable_config(
    peer, tmp_path, collection_root, request, monkeypatch
):
    """Drop-in mode changes two files: the drop-in is written first, then the import in the main file. When the
    second write fails, containerd still loads the main file as it was, and the next run completes the change."""
    from conftest import ModuleRunner

    binary = request.getfixturevalue(peer)
    version = 2 if peer == "containerd16" else 3
    main = tmp_path / "config.toml"
    main.write_text((CONFIGS / ("v2-mirrors-comments.toml" if version == 2 else "v3-node.toml")).read_text())
    original = main.read_text()
    before = config_dump(binary, main)
    drop_in = tmp_path / "conf.d" / "99-nvidia.toml"
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(FAIL_WRITE)
    monkeypatch.setenv("GPUOPS_TEST_FAIL_WRITE", str(main))
    failing = ModuleRunner(collection_root, tmp_path, extra_path=[str(hook)])
    args = dict(runtime="containerd", config_path=str(main), config_mode="drop_in", drop_in_path=str(drop_in))
    failed = failing(expect_failure=True, **args)
    assert "No space left on device" in failed["msg"]
    assert drop_in.exists() and main.read_text() == original
    assert config_dump(binary, main) == before

    monkeypatch.delenv("GPUOPS_TEST_FAIL_WRITE")
    run_module = ModuleRunner(collection_root, tmp_path)
    assert run_module(**args)["changed_files"] == [str(main)]
    section = containerd_section(config_dump(binary, main), version)
    assert section["default_runtime_name"] == "nvidia"
    assert section["runtimes"]["nvidia"]["options"]["BinaryName"] == RUNTIME


def test_a_k3s_upgrade_interrupted_before_the_template_keeps_the_runtime(
    tmp_path, collection_root, k3s_render, containerd24, monkeypatch
):
    """The move from the template to the drop-in writes the drop-in first: when removing the template's block
    fails, k3s's next start still renders a config containerd loads, with the runtime (from both files)."""
    from conftest import ModuleRunner

    agent, generated = k3s_node(tmp_path, "k3s-v1.32.3-v3-base.toml")
    run_module = ModuleRunner(collection_root, tmp_path)
    args = dict(runtime="containerd", config_path=str(generated), set_as_default=False)
    run_module(**args)
    template = agent / "config-v3.toml.tmpl"
    new_base = tmp_path / "k3s-v1.36-base.toml"
    new_base.write_text(
        (K3S / "k3s-v1.36-v3-base.toml").read_text().replace("/var/lib/rancher/k3s/agent/etc/containerd", str(agent))
    )
    generated.write_text(render(k3s_render, new_base, template))

    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(FAIL_WRITE)
    monkeypatch.setenv("GPUOPS_TEST_FAIL_WRITE", str(template))
    failed = ModuleRunner(collection_root, tmp_path, extra_path=[str(hook)])(expect_failure=True, **args)
    assert "Read-only file system" in failed["msg"]
    drop_in = agent / "config-v3.toml.d" / "99-nvidia.toml"
    assert drop_in.exists() and template.exists()

    # k3s starts again: the template still renders our block next to the drop-in, and containerd loads both.
    generated.write_text(render(k3s_render, new_base, template))
    section = containerd_section(config_dump(containerd24, generated), 3)
    assert section["runtimes"]["nvidia"]["options"]["BinaryName"] == RUNTIME

    monkeypatch.delenv("GPUOPS_TEST_FAIL_WRITE")
    assert run_module(**args)["changed_files"] == [str(template)]
    assert not template.exists()
