# shellcheck shell=sh
# Run as `sh -c "$(cat boot-kernel.sh)" sh grub|grubby`: the roles pass its text to /bin/sh, it is not executed as a file.
# The kernel this node boots next, the nvidia module files under its /lib/modules/<kernel>, and the version modinfo
# reads from the module depmod indexed for it: "kernel=", "module=" (one line each) and "version=" lines, nothing
# where no kernel is found (a container). Read-only. $1: grub (Debian, Ubuntu: GRUB's default first entry, the newest
# /boot/vmlinuz-* in version order, as grub-mkconfig's 10_linux orders them) or grubby (EL: grubby's default).
# Used by gpuops.k8s.nvidia_driver (vars/main.yml) and playbooks/validate.yml; docs/kernel-updates.md.
# Kernel images are named vmlinuz-<release>, without blanks or newlines: ls serves as grub-mkconfig's own listing does.
# shellcheck disable=SC2012
case "$1" in
  grubby) kernel=$(grubby --default-kernel 2>/dev/null) && kernel=${kernel##*/vmlinuz-} || kernel= ;;
  *) kernel=$(ls -1 /boot 2>/dev/null | sed -nE -e '/[.](dpkg-.*|rpmsave|rpmnew|old)$/d' -e 's/^vmlinuz-//p' \
              | LC_ALL=C sort -V | tail -n 1) ;;
esac
[ -n "$kernel" ] || exit 0
printf 'kernel=%s\n' "$kernel"
find "/lib/modules/$kernel" \( -name nvidia.ko -o -name 'nvidia.ko.*' \) 2>/dev/null | sed 's/^/module=/'
if command -v modinfo >/dev/null 2>&1; then
  printf 'version=%s\n' "$(modinfo -k "$kernel" -F version nvidia 2>/dev/null | head -n 1)"
fi
