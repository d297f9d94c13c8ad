# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""File handling shared by gpuops.k8s modules that edit configuration files (private).

Reads as text, writes through a temporary file in the target's own directory and
``AnsibleModule.atomic_move`` (a rename, so readers see the old or the new file, never half of one;
atomic_move keeps the mode, owner and SELinux context of a file it replaces), then flushes the
directory so the rename survives a power cut, and builds the before/after diff that diff mode returns.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import contextlib

# A runtime reads every file of its drop-in directories: CRI-O all of crio.conf.d in lexical order, containerd
# and k3s every *.toml their imports name (conf.d, config-v3.toml.d). A backup there would be configuration.
BACKUP_DIR_SUFFIX = ".gpuops-backup"


def read_text(path):
    """The file's text, or None when it does not exist."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return None
    return data.decode("utf-8")


def file_diff(path, before, after):
    return {
        "before": before if before is not None else "",
        "after": after if after is not None else "",
        "before_header": path if before is not None else f"{path} (absent)",
        "after_header": path if after is not None else f"{path} (absent)",
    }


def write_atomic(module, path, text, mode_for_new=0o644):
    # atomic_move gives a new file the umask default; a new file here gets mode_for_new instead.
    """Replace ``path`` with ``text`` atomically; parent directories are created when missing."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        os.makedirs(directory, 0o755)
    existed = os.path.exists(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
        module.atomic_move(tmp, path, unsafe_writes=False)
        if not existed:
            os.chmod(path, mode_for_new)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    sync_directory(directory)


def sync_directory(directory):
    """Flush a directory's entries to disk, so that a rename into it survives a power cut."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def backup_file(module, path):
    """A timestamped copy of ``path`` (Ansible's name for it); beside it, or, where the file lives in a drop-in
    directory (a name ending in .d), in ``<that directory>.gpuops-backup`` beside the directory."""
    directory = os.path.dirname(os.path.abspath(path))
    if not directory.endswith(".d"):
        return module.backup_local(path)
    target_dir = directory + BACKUP_DIR_SUFFIX
    os.makedirs(target_dir, 0o700, exist_ok=True)
    stamp = time.strftime("%Y-%m-%d@%H:%M:%S~", time.localtime())
    target = os.path.join(target_dir, f"{os.path.basename(path)}.{os.getpid()}.{stamp}")
    shutil.copy2(path, target)
    return target


def remove_file(path):
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
