#!/usr/bin/env bash
# pdevidence runs every tree it probes contained by bubblewrap (pdevidence/core/sandbox.py): install it where it
# is missing, and lift Ubuntu 24.04's restriction on the unprivileged user namespaces it needs (GitHub's runners).
# Where neither can be done (no root, no sudo) it says so and carries on: pdevidence then refuses every tree but
# pinned releases, and says why. Used by the workflow's probe jobs and by the action (action.yml).
set -euo pipefail
as_root=()
[ "$(id -u)" -eq 0 ] || as_root=(sudo -n)
if ! command -v bwrap >/dev/null; then
    if ! { "${as_root[@]}" apt-get update -qq && "${as_root[@]}" apt-get install -y -qq bubblewrap; }; then
        echo "::warning::could not install bubblewrap: pdevidence will refuse trees that are not pinned releases"
    fi
fi
if [ "$(cat /proc/sys/kernel/apparmor_restrict_unprivileged_userns 2>/dev/null)" = 1 ]; then
    if ! "${as_root[@]}" sysctl -q -w kernel.apparmor_restrict_unprivileged_userns=0; then
        echo "::warning::user namespaces stay restricted: pdevidence will refuse trees that are not pinned releases"
    fi
fi
