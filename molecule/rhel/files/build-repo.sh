#!/usr/bin/env bash
# Builds, on the test host, the test doubles of NVIDIA's CUDA repository for RHEL 9, of EPEL and of Rocky's BaseOS:
# empty RPMs with NVIDIA's package names, epochs, versions and dependencies (docs/nvidia-rhel-packages.md; the NVLink
# fabric's services, docs/nvlink-fabric.md, with their units), signed with a throwaway key, and the nvidia-driver
# module's streams as modulemd v2 documents with their default profiles. Needs Debian's rpm, createrepo-c and gnupg.
#   build-repo.sh DIR   -> DIR/cuda/rhel9/x86_64 (with the key as D42D0685.pub, where NVIDIA keeps its own), DIR/epel
#                          and DIR/baseos
set -euo pipefail
out=$1
cuda="$out/cuda/rhel9/x86_64"
epel="$out/epel"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
baseos="$out/baseos"
mkdir -p "$cuda" "$epel" "$baseos" "$work/top/SPECS"

# One empty package: NAME VERSION EPOCH ARCH [REQUIRES...]
package() {
  local name=$1 version=$2 epoch=$3 arch=$4 requires="" r
  shift 4
  for r in "$@"; do requires+="Requires: $r"$'\n'; done
  cat > "$work/top/SPECS/$name-$version.spec" <<SPEC
Name: $name
Version: $version
Release: 1.el9
${epoch:+Epoch: $epoch}
Summary: test double of $name
License: none
BuildArch: $arch
$requires
%description
A test double: the name, version and dependencies of $name, and no files.
%files
SPEC
  rpmbuild --quiet --define "_topdir $work/top" --nodeps -bb "$work/top/SPECS/$name-$version.spec" >/dev/null
}

# One package with a systemd unit and nothing else: NAME VERSION UNIT
package_with_unit() {
  local name=$1 version=$2 unit=$3
  cat > "$work/top/SPECS/$name-$version.spec" <<SPEC
Name: $name
Version: $version
Release: 1.el9
Summary: test double of $name
License: none
BuildArch: x86_64
%description
A test double: the name and version of $name, and its unit, which runs nothing.
%install
mkdir -p %{buildroot}/usr/lib/systemd/system
printf '[Unit]\\nDescription=test double of $name\\n[Service]\\nType=oneshot\\nExecStart=/bin/true\\n[Install]\\nWantedBy=multi-user.target\\n' > %{buildroot}/usr/lib/systemd/system/$unit
%files
/usr/lib/systemd/system/$unit
SPEC
  rpmbuild --quiet --define "_topdir $work/top" --nodeps -bb "$work/top/SPECS/$name-$version.spec" >/dev/null
}

# Two versions of branch 580 (an update within the branch) and one of 570 (a branch change).
versions=(570.195.03 580.95.05 580.105.08)
for v in "${versions[@]}"; do
  package nvidia-kmod-common "$v" 3 noarch
  package nvidia-driver "$v" 3 x86_64 "nvidia-kmod-common = 3:$v"
  package kmod-nvidia-latest-dkms "$v" 3 x86_64 dkms "nvidia-kmod-common = 3:$v"
  package kmod-nvidia-open-dkms "$v" 3 x86_64 dkms "nvidia-kmod-common = 3:$v"
  package nvidia-persistenced "$v" 3 x86_64
  # The fabric services, in the driver's version, under the branch's names (nvidia-imex-570, nvidia-fabric-manager
  # before 580).
  if [ "${v%%.*}" -ge 580 ]; then fm=nvidia-fabricmanager imex=nvidia-imex; else fm=nvidia-fabric-manager imex=nvidia-imex-${v%%.*}; fi
  package_with_unit "$fm" "$v" nvidia-fabricmanager.service
  package_with_unit "$imex" "$v" nvidia-imex.service
done
package nvlsm 2025.06.10 "" x86_64
find "$work/top/RPMS" -name '*.rpm' -exec mv {} "$cuda/" \;
package dkms 3.2.1 "" noarch
find "$work/top/RPMS" -name '*.rpm' -exec mv {} "$epel/" \;
# Rocky's python3-pip (a version of the double's own), for the role's pip step; Debian's pip3 is the one the node
# runs (prepare.yml).
package python3-pip 21.3.1 "" noarch
# Rocky's infiniband-diags (the double's own version), which the role installs beside nvlsm.
package infiniband-diags 51.0 "" x86_64
find "$work/top/RPMS" -name '*.rpm' -exec mv {} "$baseos/" \;

export GNUPGHOME="$work/gnupg"
mkdir -m 0700 "$GNUPGHOME"
gpg --batch --passphrase '' --quick-gen-key 'gpuops test double repository <repo@gpuops.invalid>' rsa2048 sign never 2>/dev/null
rpmsign --define '__gpg /usr/bin/gpg' --define '_gpg_name gpuops test double repository' --addsign "$cuda"/*.rpm \
  </dev/null >/dev/null 2>&1
gpg --armor --export > "$cuda/D42D0685.pub"

# The module: each stream of each version, a context and a version number of its own, and the default profile.
{
  n=0
  for v in "${versions[@]}"; do
    branch=${v%%.*}
    for stream in "$branch-dkms" "$branch-open" latest-dkms open-dkms; do
      case $stream in *open*) kmod="kmod-nvidia-open-dkms" ;; *) kmod="kmod-nvidia-latest-dkms" ;; esac
      n=$((n + 1))
      cat <<DOC
---
document: modulemd
version: 2
data:
  name: nvidia-driver
  stream: "$stream"
  version: $n
  context: "0000000$((n % 10))"
  arch: x86_64
  summary: test double of the nvidia-driver module
  description: test double
  license:
    module: [MIT]
  profiles:
    default:
      rpms: [nvidia-driver, $kmod, nvidia-persistenced]
  artifacts:
    rpms: [nvidia-driver-3:$v-1.el9.x86_64, nvidia-kmod-common-3:$v-1.el9.noarch, $kmod-3:$v-1.el9.x86_64, nvidia-persistenced-3:$v-1.el9.x86_64]
...
DOC
    done
  done
  printf -- '---\ndocument: modulemd-defaults\nversion: 1\ndata:\n  module: nvidia-driver\n  profiles:\n'
  for stream in 570-dkms 570-open 580-dkms 580-open latest-dkms open-dkms; do printf '    %s: [default]\n' "$stream"; done
  printf -- '...\n'
} > "$work/modules.yaml"
createrepo_c --quiet "$cuda"
modifyrepo_c --mdtype=modules "$work/modules.yaml" "$cuda/repodata" >/dev/null
createrepo_c --quiet "$epel"
createrepo_c --quiet "$baseos"
