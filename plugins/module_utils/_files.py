# Copyright: gpuops.k8s contributors
# Apache License 2.0 (see LICENSE or https://www.apache.org/licenses/LICENSE-2.0)

"""File handling shared by gpuops.k8s modules that edit configuration files (private).

Reads as text, writes through a temporary file in the target's own directory and
``AnsibleModule.atomic_move`` (a rename, so readers see the old or the new file, never half of one;
atomic_move keeps the mode, owner and SELinux context of a file it replaces), and builds the
before/after diff that diff mode returns.
"""

from __future__ import annotations

import os
import tempfile


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
        "before_header": path if before is not None else "{0} (absent)".format(path),
        "after_header": path if after is not None else "{0} (absent)".format(path),
    }


def write_atomic(module, path, text, mode_for_new=0o644):
    # atomic_move gives a new file the umask default; a new file here gets mode_for_new instead.
    """Replace ``path`` with ``text`` atomically; parent directories are created when missing."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        os.makedirs(directory, 0o755)
    existed = os.path.exists(path)
    fd, tmp = tempfile.mkstemp(prefix=".{0}.".format(os.path.basename(path)), dir=directory)
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


def remove_file(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
