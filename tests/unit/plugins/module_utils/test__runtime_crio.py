# Unit tests of CRI-O's rules for the nvidia runtime (text in, text out).
from __future__ import annotations

import pytest
import tomllib
from ansible_collections.gpuops.k8s.plugins.module_utils._runtime_config import ConfigError
from ansible_collections.gpuops.k8s.plugins.module_utils._runtime_crio import edit_crio

RUNTIME = "/usr/bin/nvidia-container-runtime"


def lines(text):
    return [line for line in text.splitlines() if line.strip()]


def crio(text, state="present", set_as_default=True):
    return edit_crio(text, "/etc/crio/crio.conf.d/99-nvidia.toml", "nvidia", RUNTIME, set_as_default, state)


def test_crio_new_drop_in():
    result = crio("")
    data = tomllib.loads(result.text)
    assert data == {
        "crio": {
            "runtime": {
                "default_runtime": "nvidia",
                "runtimes": {"nvidia": {"runtime_path": RUNTIME, "runtime_type": "oci"}},
            }
        }
    }
    assert result.runtime_entry == {"runtime_path": RUNTIME, "runtime_type": "oci"}
    assert not crio(result.text).changed
    assert lines(crio(result.text, state="absent").text) == []


def test_crio_existing_file_keeps_comments_and_restores_default():
    text = '# site drop-in\n[crio.runtime]\ndefault_runtime = "crun"  # fast\nlog_size_max = 8192\n'
    present = crio(text)
    assert tomllib.loads(present.text)["crio"]["runtime"]["log_size_max"] == 8192
    assert "# site drop-in" in present.text
    assert lines(crio(present.text, state="absent").text) == lines(text)


def test_crio_without_default():
    result = crio("", set_as_default=False)
    assert "default_runtime" not in tomllib.loads(result.text)["crio"]["runtime"]
    assert result.default_runtime is None


def test_crio_existing_entry_is_updated_or_refused():
    ok = crio('[crio.runtime.runtimes.nvidia]\nruntime_type = ""\n')
    assert tomllib.loads(ok.text)["crio"]["runtime"]["runtimes"]["nvidia"] == {
        "runtime_type": "oci",
        "runtime_path": RUNTIME,
    }
    with pytest.raises(ConfigError) as err:
        crio('[crio.runtime.runtimes.nvidia]\nruntime_path = "/usr/bin/crun"\n')
    assert 'runtime_path "/usr/bin/crun"' in str(err.value)


# ------------------------------------------------------------------------------------------ Docker


def test_a_blank_line_between_crio_runtime_and_a_runtime_table_converges():
    # Reported from a real node: the TOML library the module used before stopped with an internal error here.
    text = '[crio.runtime]\n\n[crio.runtime.runtimes.crun]\nruntime_path = "/usr/bin/crun"\n'
    present = crio(text)
    assert present.text == (
        '[crio.runtime]\ndefault_runtime = "nvidia" # gpuops.k8s.nvidia_runtime: previous default unset\n\n'
        '[crio.runtime.runtimes.crun]\nruntime_path = "/usr/bin/crun"\n\n'
        f'[crio.runtime.runtimes.nvidia]\nruntime_path = "{RUNTIME}"\nruntime_type = "oci"\n'
    )
    assert not crio(present.text).changed
    assert crio(present.text, state="absent").text == text
