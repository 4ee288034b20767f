#!/usr/bin/env bash
# The root file system of the real-systemd deployment test (tests/test_systemd_deploy.py): a
# Debian bookworm that a GPU node or an analyzer host could be, booted by systemd-nspawn.
#
#   bash tests/systemd/build-rootfs.sh [ROOT]      (root; default ROOT: .cache/systemd-rootfs)
#
# What it holds, so that the test's install steps (the README's, run as written) need no network:
#   * systemd, dbus, sudo, python3 with venv, openssl, iproute2, gcc (the agent measures its probe
#     cost with a helper it compiles), bcc (python3-bpfcc) and Debian's kernel headers
#     (linux-headers-amd64: install-node.sh links them for a kernel without packaged headers);
#   * a wheelhouse of hypertrace's dependencies, downloaded from the package index by the
#     container's own pip, and /etc/pip.conf pointing pip at it (no index): an air-gapped node.
# Made once (debootstrap 1-2 minutes, the wheels under a minute) and kept while the stamp's
# key (this script and setup.cfg's requirements) is unchanged. Builds into ROOT.new and renames,
# so an interrupted build leaves no half root.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/../.." && pwd)"
ROOT="${1:-$REPO/.cache/systemd-rootfs}"
SUITE=bookworm
PACKAGES=systemd,systemd-sysv,dbus,sudo,python3,python3-venv,python3-bpfcc,bpfcc-tools,linux-headers-amd64,gcc,libc6-dev,openssl,iproute2,ca-certificates,procps,libnss-myhostname
WHEELS=/var/cache/hypertrace-wheels

say() { echo "systemd-rootfs: $*"; }
[ "$(id -u)" = 0 ] || { say "must run as root (debootstrap, systemd-nspawn)"; exit 1; }
for tool in debootstrap systemd-nspawn; do
    command -v "$tool" >/dev/null || { say "$tool is missing (apt-get install debootstrap systemd-container)"; exit 1; }
done

key="$( (cat "$0"; sed -n '/^install_requires/,/^#/p' "$REPO/setup.cfg") | sha256sum | cut -c1-16)"
if [ -f "$ROOT/.hypertrace-rootfs" ] && [ "$(cat "$ROOT/.hypertrace-rootfs")" = "$key" ]; then
    say "$ROOT is up to date"; exit 0
fi

# The Debian mirror this machine's apt uses (deb822 .sources or one-line lists).
mirror="$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -v security | head -n1)"
[ -n "$mirror" ] || mirror="$(grep -hsE '^deb (\[[^]]*\] )?https?://' /etc/apt/sources.list /etc/apt/sources.list.d/*.list | grep -v security | awk '{for (i=2;i<=NF;i++) if ($i ~ /^https?:/) {print $i; exit}}' | head -n1)"
mirror="${mirror:-http://deb.debian.org/debian}"

new="$ROOT.new"
rm -rf "$new"
mkdir -p "$(dirname "$ROOT")"
say "debootstrap $SUITE from $mirror into $new (1-2 minutes)"
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$new" "$mirror" >"$new.log" 2>&1 \
    || { tail -n 30 "$new.log"; say "debootstrap failed (log: $new.log)"; exit 1; }
rm -f "$new"/var/cache/apt/archives/*.deb
# the host's name is not the node's: nspawn names it after --machine when there is no
# /etc/hostname, and nss-myhostname resolves it (sudo looks it up)
rm -f "$new/etc/hostname"
grep -q myhostname "$new/etc/nsswitch.conf" || sed -i 's/^hosts:.*/& myhostname/' "$new/etc/nsswitch.conf"

# The wheelhouse, with the container's own Python (its version and ABI are the node's).
reqs="$(sed -n '/^install_requires/,/^#/p' "$REPO/setup.cfg" | sed '1d;/^#/d;s/^ *//;/^$/d' | tr '\n' '\0' | xargs -0 printf '%q ')"
ca=/etc/ssl/certs/ca-certificates.crt
say "downloading the wheels of hypertrace's dependencies into $WHEELS"
systemd-nspawn -q -D "$new" --register=no --keep-unit --pipe \
    --bind-ro="$ca":/etc/ssl/host-ca.crt --setenv=PIP_CERT=/etc/ssl/host-ca.crt \
    ${PIP_INDEX_URL:+--setenv=PIP_INDEX_URL="$PIP_INDEX_URL"} \
    -- sh -c "python3 -m venv /tmp/dl && /tmp/dl/bin/pip download -q -d $WHEELS \
              'setuptools>=68' wheel pip $reqs && rm -rf /tmp/dl" \
    || { say "pip download in the container failed"; exit 1; }
printf '[global]\nno-index = true\nfind-links = %s\ndisable-pip-version-check = true\n' "$WHEELS" \
    > "$new/etc/pip.conf"
echo "$key" > "$new/.hypertrace-rootfs"
rm -rf "$ROOT" "$new.log"
mv "$new" "$ROOT"
say "ready: $ROOT ($(du -sh "$ROOT" | cut -f1))"
