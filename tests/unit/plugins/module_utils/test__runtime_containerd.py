# Unit tests of containerd's rules for the nvidia runtime (text in, text out); tomllib is the
# independent judge of what a TOML result means.
from __future__ import annotations

import pytest
import tomllib
from ansible_collections.gpuops.k8s.plugins.module_utils import _runtime_containerd as rc
from ansible_collections.gpuops.k8s.plugins.module_utils._runtime_config import ConfigError

RUNTIME = "/usr/bin/nvidia-container-runtime"
CRI2 = "io.containerd.grpc.v1.cri"
CRI3 = "io.containerd.cri.v1.runtime"

V2 = """\
version = 2
root = "/var/lib/containerd"  # data lives here

# the CRI plugin
[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.9"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"   # kubelet default
      snapshotter = "overlayfs"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        privileged_without_host_devices = false
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = true  # matches the kubelet
          NoPivotRoot = false
"""

V3 = """\
version = 3
[plugins."io.containerd.cri.v1.runtime".containerd]
  default_runtime_name = "runc"
  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    sandboxer = "podsandbox"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
      SystemdCgroup = true
"""


def lines(text):
    """The non-blank lines."""
    return [line for line in text.splitlines() if line.strip()]


def containerd(text, state="present", set_as_default=True, name="nvidia", path=RUNTIME):
    return rc.edit_containerd(text, "/etc/containerd/config.toml", name, path, set_as_default, state)


def cri(text, plugin=CRI2):
    return tomllib.loads(text)["plugins"][plugin]["containerd"]


def test_v2_present_inherits_runc_and_becomes_default():
    result = containerd(V2)
    assert result.changed
    assert result.config_version == 2
    section = cri(result.text)
    assert section["default_runtime_name"] == "nvidia"
    nvidia = section["runtimes"]["nvidia"]
    assert nvidia["runtime_type"] == "io.containerd.runc.v2"
    assert nvidia["privileged_without_host_devices"] is False
    assert nvidia["options"] == {"SystemdCgroup": True, "NoPivotRoot": False, "BinaryName": RUNTIME}
    assert result.runtime_entry == nvidia
    assert result.default_runtime == "nvidia"
    # every original comment is still there, and the previous default is recorded
    for comment in ("# data lives here", "# the CRI plugin", "# kubelet default", "# matches the kubelet"):
        assert comment in result.text
    assert 'previous default "runc"' in result.text


def test_v2_second_present_is_a_no_op():
    once = containerd(V2)
    twice = containerd(once.text)
    assert not twice.changed
    assert twice.text == once.text


def test_v2_present_then_absent_restores_every_line():
    present = containerd(V2)
    absent = containerd(present.text, state="absent")
    assert absent.changed
    assert lines(absent.text) == lines(V2)
    assert absent.runtime_entry is None
    assert absent.default_runtime == "runc"


def test_v2_new_tables_follow_runc_indentation_and_absent_gives_back_the_bytes():
    present = containerd(V2, set_as_default=False)
    assert present.text == V2 + (
        '      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n'
        '        runtime_type = "io.containerd.runc.v2"\n'
        "        privileged_without_host_devices = false\n"
        '        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]\n'
        "          SystemdCgroup = true\n"
        "          NoPivotRoot = false\n"
        f'          BinaryName = "{RUNTIME}"\n'
    )
    assert containerd(present.text, state="absent").text == V2
    with_default = containerd(V2)
    assert containerd(with_default.text, state="absent").text == V2


BLANK_LINES_V3 = """\
version = 3

[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = 'runc'

  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes]

    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'

      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = false

  [plugins.'io.containerd.cri.v1.runtime'.containerd.x]
    y = 1
"""


def test_blank_lines_and_literal_quotes_are_followed_both_ways():
    present = containerd(BLANK_LINES_V3)
    assert "  default_runtime_name = 'nvidia' # gpuops.k8s.nvidia_runtime" in present.text
    assert (
        "        SystemdCgroup = false\n\n"
        "    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia]\n"
        "      runtime_type = 'io.containerd.runc.v2'\n\n"
        "      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.nvidia.options]\n"
        "        SystemdCgroup = false\n"
        f"        BinaryName = '{RUNTIME}'\n\n"
        "  [plugins.'io.containerd.cri.v1.runtime'.containerd.x]\n"
    ) in present.text
    assert containerd(present.text, state="absent").text == BLANK_LINES_V3


def test_a_table_added_at_the_end_takes_its_blank_line_with_it():
    # The same file without its last table: it ends with runc's options, no blank line after them.
    text = BLANK_LINES_V3[: BLANK_LINES_V3.index("\n\n  [plugins.'io.containerd.cri.v1.runtime'.containerd.x]")] + "\n"
    assert text.endswith("SystemdCgroup = false\n")
    present = containerd(text)
    assert "SystemdCgroup = false\n\n    [plugins." in present.text
    assert containerd(present.text, state="absent").text == text


def test_unindented_files_stay_unindented():
    text = (
        "version = 2\n"
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
        'runtime_type = "io.containerd.runc.v2"\n'
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n'
        "SystemdCgroup = true\n"
    )
    present = containerd(text, set_as_default=False)
    assert present.text == text + (
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n'
        'runtime_type = "io.containerd.runc.v2"\n'
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]\n'
        "SystemdCgroup = true\n"
        f'BinaryName = "{RUNTIME}"\n'
    )
    assert containerd(present.text, state="absent").text == text


def test_v3_uses_the_cri_runtime_plugin_and_copies_runc_fields():
    result = containerd(V3)
    assert result.config_version == 3
    nvidia = cri(result.text, CRI3)["runtimes"]["nvidia"]
    assert nvidia["sandboxer"] == "podsandbox"
    assert nvidia["options"]["SystemdCgroup"] is True
    assert CRI2 not in result.text
    assert lines(containerd(result.text, state="absent").text) == lines(V3)


def test_set_as_default_false_leaves_the_default():
    result = containerd(V2, set_as_default=False)
    section = cri(result.text)
    assert section["default_runtime_name"] == "runc"
    assert "nvidia" in section["runtimes"]
    assert result.default_runtime == "runc"
    assert lines(containerd(result.text, state="absent", set_as_default=False).text) == lines(V2)


BUILTIN_RUNC = {"runtime_type": "io.containerd.runc.v2"}


def test_minimal_file_gets_the_whole_path_and_absent_removes_it_again():
    result = containerd(rc.MINIMAL_CONTAINERD_CONFIG)
    section = cri(result.text)
    assert section["default_runtime_name"] == "nvidia"
    assert section["runtimes"] == {
        "nvidia": {"runtime_type": "io.containerd.runc.v2", "options": {"BinaryName": RUNTIME}},
        "runc": BUILTIN_RUNC,
    }
    assert containerd(result.text, state="absent").text == rc.MINIMAL_CONTAINERD_CONFIG


def test_minimal_file_without_default_uses_implicit_tables_only():
    result = containerd("version = 2\n", set_as_default=False)
    assert "default_runtime_name" not in cri(result.text)
    assert set(cri(result.text)["runtimes"]) == {"nvidia", "runc"}
    assert containerd(result.text, state="absent").text == "version = 2\n"


# containerd 1.x takes a version 2 file's runtimes table instead of its built-in one, so the file that
# lists no runtime gets runc listed next to nvidia (Debian's packaged config is such a file).
DEBIAN_LIKE = """\
version = 2

[plugins]

  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.8"

    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"  # the node's choice

  [plugins."io.containerd.gc.v1.scheduler"]
    pause_threshold = 0.02
"""


CRI_ONLY = """\
version = 2

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.8"
"""


@pytest.mark.parametrize("set_as_default", [True, False])
@pytest.mark.parametrize("text", [DEBIAN_LIKE, DEBIAN_LIKE.replace("\n\n", "\n").replace("  ", ""), CRI_ONLY])
def test_a_file_without_runtimes_keeps_the_builtin_runc(text, set_as_default):
    present = containerd(text, set_as_default=set_as_default)
    # One blank line between tables where the file has them, never two (tables without a header
    # of their own, like containerd.runtimes here, write nothing).
    assert "\n\n\n" not in present.text
    section = cri(present.text)
    assert section["runtimes"]["runc"] == BUILTIN_RUNC
    assert section.get("default_runtime_name", "runc") in section["runtimes"]
    assert section.get("snapshotter") == ("overlayfs" if "snapshotter" in text else None)
    runc_line = next(
        line
        for line in present.text.splitlines()
        if line.strip().startswith("runtime_type") and "built-in runc" in line
    )
    assert runc_line.endswith("# " + rc.RUNC_MARKER)
    assert not containerd(present.text, set_as_default=set_as_default).changed
    absent = containerd(present.text, state="absent", set_as_default=set_as_default)
    assert absent.text == text


KATA = "[plugins.'io.containerd.grpc.v1.cri'.containerd.runtimes.kata]\nruntime_type = 'io.containerd.kata.v2'\n"


def test_the_builtin_runc_is_not_added_where_the_file_lists_runtimes_or_to_version_3():
    # A file that lists runtimes already decides which exist (V2 lists runc; this one only kata).
    assert containerd(V2).text.count(rc.RUNC_MARKER) == 0
    kata_only = "version = 2\n" + KATA
    assert set(cri(containerd(kata_only).text)["runtimes"]) == {"kata", "nvidia"}
    # containerd 2.x keeps its built-in runc next to the file's runtimes.
    assert set(cri(containerd("version = 3\n").text, CRI3)["runtimes"]) == {"nvidia"}


def test_absent_keeps_the_added_runc_while_the_file_needs_it():
    present = containerd(rc.MINIMAL_CONTAINERD_CONFIG).text
    # Another runtime listed since: runc has to stay listed for containerd 1.x to keep it.
    with_kata = present + KATA
    assert set(cri(containerd(with_kata, state="absent").text)["runtimes"]) == {"kata", "runc"}
    # An operator's setting on it: the entry is theirs now.
    edited = present.replace(f"# {rc.RUNC_MARKER}\n", f"# {rc.RUNC_MARKER}\nprivileged_without_host_devices = true\n")
    assert cri(containerd(edited, state="absent").text)["runtimes"]["runc"]["privileged_without_host_devices"] is True
    # Without the marker it was never ours.
    unmarked = present.replace(f" # {rc.RUNC_MARKER}", "")
    assert cri(containerd(unmarked, state="absent").text)["runtimes"] == {"runc": BUILTIN_RUNC}


def test_absent_without_marker_falls_back_to_containerd_default():
    text = V2.replace('default_runtime_name = "runc"   # kubelet default', 'default_runtime_name = "nvidia"')
    text += (
        '      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n'
        '        runtime_type = "io.containerd.runc.v2"\n'
        '        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]\n'
        f'          BinaryName = "{RUNTIME}"\n'
    )
    result = containerd(text, state="absent")
    section = cri(result.text)
    assert "default_runtime_name" not in section
    assert "nvidia" not in section["runtimes"]
    assert result.default_runtime == "runc"


def test_absent_restores_a_previous_default_that_was_not_runc():
    text = V2.replace('"runc"   # kubelet default', '"kata"   # kubelet default')
    present = containerd(text)
    assert 'previous default "kata"' in present.text
    absent = containerd(present.text, state="absent")
    assert lines(absent.text) == lines(text)


def test_absent_on_a_config_without_nvidia_changes_nothing():
    result = containerd(V2, state="absent")
    assert not result.changed
    assert result.text == V2


def test_existing_compatible_entry_is_completed_not_duplicated():
    text = V2 + (
        '      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n'
        '        runtime_type = "io.containerd.runc.v2"\n'
        '        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]\n'
        "          SystemdCgroup = false\n"
    )
    result = containerd(text)
    nvidia = cri(result.text)["runtimes"]["nvidia"]
    assert nvidia["options"] == {"SystemdCgroup": True, "BinaryName": RUNTIME}
    assert result.text.count("runtimes.nvidia]") == 1
    assert not containerd(result.text).changed


def test_existing_entry_without_options_gets_them():
    text = V2 + '      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n        runtime_type = ""\n'
    nvidia = cri(containerd(text).text)["runtimes"]["nvidia"]
    assert nvidia["runtime_type"] == "io.containerd.runc.v2"
    assert nvidia["options"]["BinaryName"] == RUNTIME


@pytest.mark.parametrize(
    "body",
    [
        'runtime_type = "io.containerd.kata.v2"\n',
        'runtime_type = "io.containerd.runc.v2"\n        options = { BinaryName = "/usr/bin/other" }\n',
    ],
)
@pytest.mark.parametrize("state", ["present", "absent"])
def test_an_entry_of_another_runtime_is_not_clobbered(body, state):
    text = V2 + '      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n        ' + body
    with pytest.raises(ConfigError) as err:
        containerd(text, state=state)
    message = str(err.value)
    assert "/etc/containerd/config.toml already has a runtime" in message
    assert "choose another runtime_name" in message


def test_runtime_name_is_configurable():
    result = containerd(V2, name="nvidia-cdi")
    assert "nvidia-cdi" in cri(result.text)["runtimes"]
    assert cri(result.text)["default_runtime_name"] == "nvidia-cdi"


def test_user_comment_on_the_default_line_survives_both_ways():
    present = containerd(V2)
    assert 'default_runtime_name = "nvidia"   # kubelet default # gpuops.k8s.nvidia_runtime' in present.text
    again = containerd(present.text.replace('"nvidia"   #', '"runc"   #'))
    assert again.text.count("gpuops.k8s.nvidia_runtime") == 1


def test_inline_runtimes_table_gets_an_inline_entry():
    text = (
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n'
        'runtimes = { runc = { runtime_type = "io.containerd.runc.v2", options = { SystemdCgroup = true } } }\n'
    )
    result = containerd(text)
    nvidia = cri(result.text)["runtimes"]["nvidia"]
    assert nvidia["options"] == {"SystemdCgroup": True, "BinaryName": RUNTIME}
    assert containerd(result.text, state="absent").text.count("nvidia") == 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('root = "/x"\n', "has no top-level version key, which containerd reads as config version 1"),
        ("version = 5\n", "declares containerd config version 5; this module edits versions 2, 3 and 4 only"),
        ('version = "2"\n', 'declares containerd config version "2"'),
        ("version = true\n", "declares containerd config version true"),
    ],
)
def test_unsupported_versions_get_one_sentence(text, expected):
    with pytest.raises(ConfigError) as err:
        containerd(text)
    assert expected in str(err.value)


def test_parse_error_names_file_line_and_column():
    with pytest.raises(ConfigError) as err:
        containerd("version = 2\n[plugins\nx = 1\n")
    message = str(err.value)
    assert message.startswith("/etc/containerd/config.toml could not be parsed as TOML: line 2, column")
    assert "\n" not in message


def test_a_non_table_on_the_path_is_reported():
    with pytest.raises(ConfigError) as err:
        containerd('version = 2\nplugins = "none"\n')
    assert "plugins is a str, but a table was expected there" in str(err.value)
    with pytest.raises(ConfigError) as err:
        containerd('version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\nruntimes = 3\n')
    assert 'plugins."io.containerd.grpc.v1.cri".containerd.runtimes is a int' in str(err.value)


def test_entry_that_is_not_a_table_is_reported():
    with pytest.raises(ConfigError) as err:
        containerd('version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes]\nnvidia = "x"\n')
    assert "runtimes.nvidia is a str, but a table was expected there" in str(err.value)


def test_absent_on_a_file_without_the_plugin_section():
    result = containerd('version = 2\nroot = "/x"\n', state="absent")
    assert not result.changed


def test_out_of_order_tables_are_edited_in_place():
    text = (
        "version = 2\n"
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\nruntime_type = "io.containerd.runc.v2"\n'
        '[debug]\nlevel = "info"\n'
        '[plugins."io.containerd.grpc.v1.cri".containerd]\nsnapshotter = "overlayfs"\n'
    )
    result = containerd(text)
    section = cri(result.text)
    assert section["default_runtime_name"] == "nvidia"
    assert section.get("snapshotter") == ("overlayfs" if "snapshotter" in text else None)
    assert tomllib.loads(result.text)["debug"] == {"level": "info"}
    assert tomllib.loads(containerd(result.text, state="absent").text) == tomllib.loads(text)


# ------------------------------------------------------------------------------------------- CRI-O


def test_a_layout_tomlkit_cannot_reproduce_is_not_rewritten_without_a_change():
    # A round-tripping TOML library re-indents the second header of this layout; a run that changes
    # nothing must not, and edits leave the headers' own spelling and indentation alone.
    text = (
        'version = 2\n[plugins."io.containerd.monitor.v1.cgroups"]\n'
        '  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n    runtime_type = "io.containerd.runc.v2"\n'
        '  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata]\n    runtime_type = "io.containerd.kata.v2"\n'
    )
    present = containerd(text)
    assert present.changed
    again = containerd(present.text)
    assert not again.changed
    assert again.text == present.text
    absent = containerd(present.text, state="absent")
    assert tomllib.loads(absent.text) == tomllib.loads(text)


# ------------------------------------------------------------------ entries other installers left

OPERATOR_V2 = """\
version = 2
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
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia-legacy]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia-legacy.options]
      BinaryName = "/usr/local/nvidia/toolkit/nvidia-container-runtime.legacy"
"""


def test_operator_entries_are_adopted_keeping_their_other_options():
    result = containerd(OPERATOR_V2)
    runtimes = cri(result.text)["runtimes"]
    assert runtimes["nvidia"] == {
        "privileged_without_host_devices": False,
        "runtime_type": "io.containerd.runc.v2",
        "options": {"BinaryName": RUNTIME, "SystemdCgroup": True},
    }
    assert runtimes["nvidia-cdi"]["options"]["BinaryName"] == RUNTIME + ".cdi"
    assert runtimes["nvidia-legacy"]["options"]["BinaryName"] == RUNTIME + ".legacy"
    assert [a["entry"].rsplit(".", 1)[-1] for a in result.adopted] == ["nvidia", "nvidia-cdi", "nvidia-legacy"]
    assert result.adopted[0]["from"] == "/usr/local/nvidia/toolkit/nvidia-container-runtime"
    # Only the three binaries changed: every other line is the same.
    changed = [pair for pair in zip(OPERATOR_V2.splitlines(), result.text.splitlines()) if pair[0] != pair[1]]
    assert len(changed) == 3 and all("BinaryName" in old for old, _new in changed)
    # The default was nvidia already (the operator's): no marker, and a second run changes nothing.
    assert "gpuops.k8s.nvidia_runtime" not in result.text
    assert not containerd(result.text).changed


def test_adopt_existing_false_names_the_entry_and_the_option():
    with pytest.raises(ConfigError) as err:
        rc.edit_containerd(OPERATOR_V2, "/etc/containerd/config.toml", "nvidia", RUNTIME, True, "present", False)
    assert str(err.value) == (
        "/etc/containerd/config.toml already has a runtime "
        'plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia '
        'whose binary is "/usr/local/nvidia/toolkit/nvidia-container-runtime" (as the GPU Operator, nvidia-ctk or k3s '
        f"write it), not {RUNTIME}; set adopt_existing to true to point it at {RUNTIME}, or remove that entry first."
    )


def test_an_nvidia_binary_in_an_unknown_place_is_not_taken():
    text = OPERATOR_V2.replace(
        '/usr/local/nvidia/toolkit/nvidia-container-runtime"', '/opt/x/nvidia-container-runtime"'
    )
    with pytest.raises(ConfigError) as err:
        containerd(text)
    assert "choose another runtime_name or remove that entry first" in str(err.value)


def test_a_default_someone_else_set_to_nvidia_stays_when_we_do_not_manage_it():
    text = OPERATOR_V2
    kept = containerd(text, set_as_default=False)
    assert cri(kept.text)["default_runtime_name"] == "nvidia"
    # absent takes our runtime out, and with it a default that would point at nothing.
    removed = containerd(kept.text, state="absent", set_as_default=False)
    assert "default_runtime_name" not in cri(removed.text)


@pytest.mark.parametrize(("version", "table"), [(2, CRI2), (3, CRI3)])
def test_cdi_is_switched_on_in_the_cri_plugin(version, table):
    text = V2 if version == 2 else V3
    result = rc.edit_containerd(text, "c.toml", "nvidia", RUNTIME, True, "present", enable_cdi=True)
    plugin = tomllib.loads(result.text)["plugins"][table]
    assert plugin["enable_cdi"] is True
    assert plugin["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]
    again = rc.edit_containerd(result.text, "c.toml", "nvidia", RUNTIME, True, "present", enable_cdi=True)
    assert not again.changed
    # Off means "leave as it is": CDI stays on, and absent leaves it too.
    assert not rc.edit_containerd(result.text, "c.toml", "nvidia", RUNTIME, True, "present").changed
    absent = rc.edit_containerd(result.text, "c.toml", "nvidia", RUNTIME, True, "absent")
    assert tomllib.loads(absent.text)["plugins"][table]["enable_cdi"] is True


# --------------------------------------------------------------------------- drop-ins and templates


def test_ensure_import_adds_the_glob_once_after_the_version_line():
    new, changed = rc.ensure_import(V2, "c.toml", "/etc/containerd/conf.d/*.toml")
    assert changed
    assert new.startswith('version = 2\nimports = ["/etc/containerd/conf.d/*.toml"]\nroot = ')
    assert rc.ensure_import(new, "c.toml", "/etc/containerd/conf.d/*.toml") == (new, False)
    listed, _changed = rc.ensure_import('version = 3\nimports = ["/a.toml"]\n', "c.toml", "/b/*.toml")
    assert tomllib.loads(listed)["imports"] == ["/a.toml", "/b/*.toml"]


def test_import_helpers(tmp_path):
    main = str(tmp_path / "config.toml")
    assert rc.imports_directory(["conf.d/*.toml"], main)
    assert not rc.imports_directory(["/etc/containerd/extra.toml"], main)
    assert rc.covers(["conf.d/*.toml"], main, str(tmp_path / "conf.d" / "99-nvidia.toml"))
    assert not rc.covers(["other/*.toml"], main, str(tmp_path / "conf.d" / "99-nvidia.toml"))


def test_a_version_2_drop_in_carries_the_main_cri_section():
    base = rc.drop_in_base(tomllib.loads(V2), 2)
    data = tomllib.loads(base)
    assert data["version"] == 2
    assert data["plugins"][CRI2] == tomllib.loads(V2)["plugins"][CRI2]
    assert rc.drop_in_base(tomllib.loads(V3), 3) == "version = 3\n"


K3S_GENERATED = """\
# File generated by k3s. DO NOT EDIT. Use config.toml.tmpl instead.
version = 2

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  SystemdCgroup = true
"""


def render(template, generated, k3s_found_nvidia=False):
    """What k3s writes from a template (a test double of Go's text/template, for these two actions only).

    Base's output stands in place of the base line; our guarded tables render unless k3s found the
    runtime itself. tests/integration renders the same templates with Go's real text/template.
    """
    base = rc.strip_rendered_block(generated).rstrip("\n")
    text = template.replace(rc.TEMPLATE_BASE, base).replace("{{ $.SystemdCgroup }}", "true")
    guard = rc.template_guard("nvidia")
    if guard in text:
        head, rest = text.split(guard, 1)
        body, tail = rest.split("{{ end }}", 1)
        text = head + ("" if k3s_found_nvidia else body) + tail
    return text


def k3s(generated, current=None, state="present"):
    return rc.edit_template(
        generated,
        current,
        "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
        name="nvidia",
        runtime_path=RUNTIME,
        set_as_default=False,
        state=state,
    )


def test_k3s_template_adds_the_runtime_on_top_of_base():
    path, result = k3s(K3S_GENERATED)
    assert path == "/var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl"
    assert result.text.startswith(rc.TEMPLATE_BASE + "\n\n" + rc.TEMPLATE_BEGIN + "\n")
    rendered = render(result.text, K3S_GENERATED)
    runtimes = cri(rendered)["runtimes"]
    assert runtimes["nvidia"] == {
        "runtime_type": "io.containerd.runc.v2",
        "options": {"SystemdCgroup": True, "BinaryName": RUNTIME},
    }
    assert result.runtime_entry == runtimes["nvidia"]
    # k3s renders it; the next run reads that rendering and changes nothing.
    _path, again = k3s(rendered, result.text)
    assert not again.changed and again.text == result.text
    # absent: the template is no longer needed at all.
    _path, removed = k3s(rendered, result.text, state="absent")
    assert removed.text is None and removed.changed


def test_k3s_template_keeps_what_the_operator_wrote_and_adds_nothing_where_base_has_the_runtime():
    own = rc.TEMPLATE_BASE + '\n\n[plugins."io.containerd.grpc.v1.cri".registry]\n  config_path = "/etc/x"\n'
    _path, result = k3s(K3S_GENERATED, own)
    assert result.text.startswith(own)
    with_nvidia = K3S_GENERATED + (
        '\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes."nvidia"]\n'
        '  runtime_type = "io.containerd.runc.v2"\n'
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes."nvidia".options]\n'
        f'  BinaryName = "{RUNTIME}"\n'
    )
    # k3s renders the runtime itself here: the guarded tables stay out of the rendering.
    _path, guarded = k3s(with_nvidia)
    assert guarded.runtime_entry["options"]["BinaryName"] == RUNTIME
    rendered = render(guarded.text, with_nvidia, k3s_found_nvidia=True)
    assert cri(rendered)["runtimes"]["nvidia"]["options"] == {"BinaryName": RUNTIME}
    _path, again = k3s(rendered, guarded.text)
    assert not again.changed


def test_a_template_that_does_not_build_on_base_is_refused():
    with pytest.raises(ConfigError) as err:
        k3s(K3S_GENERATED, "version = 2\n")
    assert "does not build on the base template" in str(err.value)


def test_a_version_3_generated_config_gets_the_v3_template():
    generated = K3S_GENERATED.replace("version = 2", "version = 3").replace("io.containerd.grpc.v1.cri", CRI3)
    path, result = k3s(generated)
    assert path.endswith("/config-v3.toml.tmpl")
    assert cri(render(result.text, generated), CRI3)["runtimes"]["nvidia"]["options"]["BinaryName"] == RUNTIME


def test_dotted_cri_keys_get_the_runtime_in_the_right_table():
    # Reported from a real node: the TOML library the module used before wrote the runtime under a top-level
    # [containerd.runtimes.nvidia] table here, and its second run left a file that did not parse.
    text = (
        'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\ncontainerd.default_runtime_name = "runc"\n'
        'containerd.runtimes.runc.runtime_type = "io.containerd.runc.v2"\n'
    )
    present = containerd(text)
    data = tomllib.loads(present.text)
    assert set(data) == {"version", "plugins"}
    assert cri(present.text)["runtimes"]["nvidia"]["options"]["BinaryName"] == RUNTIME
    assert cri(present.text)["default_runtime_name"] == "nvidia"
    assert not containerd(present.text).changed
    assert containerd(present.text, state="absent").text == text


K3S_FOUND_V3 = """\
# File generated by k3s. DO NOT EDIT. Use config-v3.toml.tmpl instead.
version = 3

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  SystemdCgroup = true

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.'nvidia']
  runtime_type = "io.containerd.runc.v2"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.'nvidia'.options]
  BinaryName = "/opt/kwasm/bin/nvidia-container-runtime"
  SystemdCgroup = true

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.'nvidia-experimental']
  runtime_type = "io.containerd.runc.v2"

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.'nvidia-experimental'.options]
  BinaryName = "/opt/kwasm/bin/nvidia-container-runtime-experimental"
  SystemdCgroup = true
"""


def test_k3s_experimental_entry_is_adopted_with_its_hyphenated_binary():
    """k3s writes nvidia-experimental with nvidia-container-runtime-experimental (a hyphen, not a dot), found by
    searching /usr/local/nvidia/toolkit:/opt/kwasm/bin:$PATH."""
    result = rc.edit_containerd(K3S_FOUND_V3, "config.toml", "nvidia", RUNTIME, True, "present")
    runtimes = tomllib.loads(result.text)["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]
    assert runtimes["nvidia"]["options"]["BinaryName"] == RUNTIME
    assert runtimes["nvidia-experimental"]["options"]["BinaryName"] == RUNTIME + "-experimental"
    assert [a["to"] for a in result.adopted] == [RUNTIME, RUNTIME + "-experimental"]


def test_generated_by_reads_the_k3s_and_rke2_header():
    assert rc.generated_by(K3S_FOUND_V3) == "k3s"
    assert (
        rc.generated_by("# File generated by rke2. DO NOT EDIT. Use config.toml.tmpl instead.\nversion = 2\n") == "rke2"
    )
    assert rc.generated_by("version = 2\n# File generated by k3s. DO NOT EDIT.\n") is None
    assert rc.generated_by(None) is None
