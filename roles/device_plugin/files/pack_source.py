"""Pack the device plugin's source for the systemd mode: one reproducible tar, copied in one transfer.

    pack_source.py SOURCE_DIR CACHE_DIR   -> prints the path of CACHE_DIR/device-plugin-src-<digest>.tar

The same source always gives the same bytes (sorted names, fixed owner and mtime, modes normalised),
so the node's copy changes only when the source does. Runs on the control host with the Python that
runs Ansible; the standard library only.
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
import tarfile
import tempfile

# A fixed date after 1980: wheels (ZIP) cannot hold earlier timestamps.
FIXED_MTIME = 946684800
TOP_FILES = ("pyproject.toml", "README.md")


def member_names(root: str) -> list[str]:
    names = list(TOP_FILES)
    for dirpath, dirnames, filenames in os.walk(os.path.join(root, "src")):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        rel = os.path.relpath(dirpath, root)
        names.append(rel)
        names.extend(os.path.join(rel, f) for f in sorted(filenames) if not f.endswith(".pyc"))
    return names


def pack(root: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name in member_names(root):
            # The package's _shared files are links to the collection's module_utils: the archive holds
            # the files themselves.
            path = os.path.realpath(os.path.join(root, name))
            info = tar.gettarinfo(path, arcname=name)
            info.mtime = FIXED_MTIME
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mode = 0o755 if info.isdir() or info.mode & 0o111 else 0o644
            if info.isfile():
                with open(path, "rb") as handle:
                    tar.addfile(info, handle)
            else:
                tar.addfile(info)
    return buffer.getvalue()


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: pack_source.py SOURCE_DIR CACHE_DIR", file=sys.stderr)
        return 2
    source, cache = argv[1], os.path.expanduser(argv[2])
    if not os.path.isfile(os.path.join(source, "pyproject.toml")):
        print(f"{source} is not the device plugin's source (no pyproject.toml there).", file=sys.stderr)
        return 1
    data = pack(source)
    dest = os.path.join(cache, f"device-plugin-src-{hashlib.sha256(data).hexdigest()[:16]}.tar")
    if not os.path.exists(dest):
        os.makedirs(cache, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cache, suffix=".tmp")
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    print(dest)
    # The archive's SHA-1, which the role compares with the copy on the node (ansible.builtin.copy's checksum).
    print(hashlib.sha1(data).hexdigest())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
