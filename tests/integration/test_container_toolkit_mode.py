"""container_toolkit sets nvidia-container-runtime's mode in the toolkit's config.toml, judged by the real
nvidia-ctk (NVIDIA's, built from its Go module by scripts/build-toolkit-repo.sh, run from the repository's bin/).

The role's configure tasks run with ansible-playbook on this machine (connection local) against a config file in
a temporary directory; the role reads the edited text back with that nvidia-ctk before writing it.
"""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import recap_changed

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def nvidia_ctk() -> Path:
    root = subprocess.run(
        [str(REPO / "scripts" / "build-toolkit-repo.sh")], check=True, capture_output=True, text=True, timeout=1800
    ).stdout.strip()
    return Path(root) / "bin" / "nvidia-ctk"


@pytest.fixture(scope="module")
def collections(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("collections")
    (root / "ansible_collections" / "gpuops").mkdir(parents=True)
    (root / "ansible_collections" / "gpuops" / "k8s").symlink_to(REPO)
    return root


def default_config(nvidia_ctk: Path) -> str:
    return subprocess.run(
        [str(nvidia_ctk), "--quiet", "config", "default"], check=True, capture_output=True, text=True
    ).stdout


def mode_read_by_nvidia_ctk(nvidia_ctk: Path, config: Path) -> str:
    out = subprocess.run(
        [str(nvidia_ctk), "--quiet", "config", f"--config-file={config}"], check=True, capture_output=True, text=True
    ).stdout
    return next(line.split('"')[1] for line in out.splitlines() if line.startswith("mode = "))


def run_role(
    collections: Path, nvidia_ctk: Path, config: Path, mode: str, *flags: str
) -> subprocess.CompletedProcess[str]:
    play = [
        {
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "tasks": [
                {
                    "ansible.builtin.include_role": {"name": "gpuops.k8s.container_toolkit", "tasks_from": "configure"},
                    "vars": {"container_toolkit_runtime_mode": mode, "container_toolkit_cdi": False},
                }
            ],
        }
    ]
    playbook = config.parent / "play.yml"
    playbook.write_text(yaml.safe_dump(play))
    extra = {"__container_toolkit_config_file": str(config), "__container_toolkit_nvidia_ctk": str(nvidia_ctk)}
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(collections), ANSIBLE_NOCOLOR="1")
    return subprocess.run(
        [
            "ansible-playbook",
            "-i",
            "localhost,",
            "-e",
            f"ansible_python_interpreter={sys.executable}",
            "-e",
            yaml.safe_dump(extra, default_flow_style=True).strip(),
            *flags,
            str(playbook),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def changed(run: subprocess.CompletedProcess[str]) -> int:
    return recap_changed(run.stdout)


def test_the_mode_is_the_one_value_that_changes(collections: Path, nvidia_ctk: Path, tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    # The package's file, with an operator's own comment, key and table.
    original = (
        default_config(nvidia_ctk).replace(
            'log-level = "info"', '# raised while debugging a node\nlog-level = "debug"  # until Friday'
        )
        + '\n# site settings\n[site]\nowner = "gpu-team"\n'
    )
    config.write_text(original)

    check = run_role(collections, nvidia_ctk, config, "cdi", "--check", "--diff")
    assert check.returncode == 0, check.stdout + check.stderr
    assert changed(check) == 1
    assert config.read_text() == original
    assert '-mode = "auto"' in check.stdout and '+mode = "cdi"' in check.stdout

    first = run_role(collections, nvidia_ctk, config, "cdi")
    assert first.returncode == 0, first.stdout + first.stderr
    assert changed(first) == 1
    edited = config.read_text()
    delta = [
        line
        for line in difflib.unified_diff(original.splitlines(), edited.splitlines(), lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]
    assert delta == ['-mode = "auto"', '+mode = "cdi"']
    assert mode_read_by_nvidia_ctk(nvidia_ctk, config) == "cdi"

    second = run_role(collections, nvidia_ctk, config, "cdi")
    assert second.returncode == 0 and changed(second) == 0, second.stdout

    back = run_role(collections, nvidia_ctk, config, "auto")
    assert back.returncode == 0 and changed(back) == 1
    assert config.read_text() == original


@pytest.mark.parametrize(
    ("original", "expected"),
    [
        # The key commented out: set right under the table's header, the comment kept.
        (
            '[nvidia-container-runtime]\n#mode = "auto"\nlog-level = "info"\n',
            '[nvidia-container-runtime]\nmode = "legacy"\n#mode = "auto"\nlog-level = "info"\n',
        ),
        # No such table (and no final newline): a table of its own at the end.
        (
            "[nvidia-container-cli]\nload-kmods = true",
            '[nvidia-container-cli]\nload-kmods = true\n\n[nvidia-container-runtime]\nmode = "legacy"\n',
        ),
        # A literal string, and a sub-table before the key's own table.
        (
            "[nvidia-container-runtime.modes.cdi]\ndefault-kind = 'nvidia.com/gpu'\n"
            "[nvidia-container-runtime]\nmode = 'cdi'\n",
            "[nvidia-container-runtime.modes.cdi]\ndefault-kind = 'nvidia.com/gpu'\n"
            '[nvidia-container-runtime]\nmode = "legacy"\n',
        ),
    ],
    ids=["commented-key", "no-table", "literal-string"],
)
def test_other_layouts(collections: Path, nvidia_ctk: Path, tmp_path: Path, original: str, expected: str) -> None:
    config = tmp_path / "config.toml"
    config.write_text(original)
    run = run_role(collections, nvidia_ctk, config, "legacy")
    assert run.returncode == 0, run.stdout + run.stderr
    assert config.read_text() == expected
    assert mode_read_by_nvidia_ctk(nvidia_ctk, config) == "legacy"
    assert changed(run_role(collections, nvidia_ctk, config, "legacy")) == 0


@pytest.mark.parametrize(
    ("original", "sentence"),
    [
        # The mode set as a dotted key: the role would add a table nvidia-ctk refuses as a second definition.
        ('nvidia-container-runtime.mode = "legacy"\n', "nvidia-ctk cannot read the edited file ("),
        ("[nvidia-container-runtime\nmode = 'auto'\n", "nvidia-ctk cannot read the edited file ("),
    ],
    ids=["dotted-key", "broken-toml"],
)
def test_a_file_nvidia_ctk_would_not_read_is_left_alone_with_a_sentence(
    collections: Path, nvidia_ctk: Path, tmp_path: Path, original: str, sentence: str
) -> None:
    config = tmp_path / "config.toml"
    config.write_text(original)
    run = run_role(collections, nvidia_ctk, config, "cdi")
    assert run.returncode != 0
    assert f'{config} on localhost cannot be given nvidia-container-runtime.mode = "cdi": {sentence}' in run.stdout, (
        run.stdout
    )
    assert "Traceback" not in run.stdout + run.stderr
    assert config.read_text() == original
