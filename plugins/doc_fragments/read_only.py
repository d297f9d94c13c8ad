# Copyright: (c) 2026, gpuops.k8s maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later


class ModuleDocFragment:
    # The attributes of a module that only reads the target.
    DOCUMENTATION = r"""
attributes:
  check_mode:
    support: full
    description: The module only reads; it behaves the same in check mode.
  diff_mode:
    support: none
    description: The module changes nothing, so there is nothing to show.
"""
