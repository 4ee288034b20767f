#!/usr/bin/env bash
# Install what the hypertrace agent's eBPF probes need on a Debian or Ubuntu GPU node:
#   * bcc (python3-bpfcc, bpfcc-tools) from the distribution: bcc is not on PyPI;
#   * kernel headers, and the /lib/modules/$(uname -r)/build link bcc compiles against. Kernels
#     without packaged headers (custom/Firecracker kernels) get the distribution's generic headers
#     linked in: uprobe programs only need the UAPI/arch headers, which are stable across versions;
#   * tracefs mounted at /sys/kernel/tracing;
#   * optionally (--venv DIR) bcc importable from a virtualenv WITHOUT exposing the rest of
#     dist-packages (a folder holding only a symlink to the bcc package, added by a .pth file).
#   * with --agent or --analyzer, hypertrace itself, as the systemd units expect it: a copy of
#     this checkout installed into its own venv /opt/hypertrace/.venv (the checkout is not
#     written to), the unit in /etc/systemd/system, /etc/hypertrace (and pki/, 0700), and for
#     the agent /etc/hypertrace/agent.toml (from deploy/agent.toml.example, kept if present) and
#     its spool /var/lib/hypertrace/spool (0700); for the analyzer /etc/hypertrace/analyzer.toml
#     (from deploy/analyzer.toml.example, kept if present). The analyzer needs none of the eBPF
#     parts and skips them.
# Idempotent and fast when already done: every step checks before acting and says what it did.
#
# usage: sudo bash deploy/install-node.sh [--agent [--analyzer-address HOST:PORT]
#            [--metrics-textfile FILE.prom] | --analyzer] [--venv DIR] [--no-apt] [--check]
#   --agent      the eBPF prerequisites plus the agent (venv, unit, config, spool)
#   --analyzer-address HOST:PORT   with --agent: set `analyzer` in agent.toml
#   --metrics-textfile FILE.prom   with --agent: set `metrics_textfile` in agent.toml (its folder
#                is made if missing: node_exporter's textfile directory)
#   --analyzer   the analyzer (venv, unit, /etc/hypertrace/analyzer.toml); no eBPF prerequisites
#   --venv DIR   also make bcc importable from the virtualenv DIR
#   --no-apt     never call apt-get (air-gapped node: install the packages yourself)
#   --check      change nothing; report what is present and what is missing (exit 1 if any)
set -u

VENV=""
SET_ANALYZER=""
SET_TEXTFILE=""
NO_APT=0
CHECK=0
ROLE=""
PREFIX=/opt/hypertrace
REPO="$(cd "$(dirname "$0")/.." 2>/dev/null && pwd)"
while [ $# -gt 0 ]; do
    case "$1" in
        --venv) VENV="${2:?--venv needs a directory}"; shift 2 ;;
        --venv=*) VENV="${1#--venv=}"; shift ;;
        --no-apt) NO_APT=1; shift ;;
        --check) CHECK=1; shift ;;
        --agent) ROLE=agent; shift ;;
        --analyzer) ROLE=analyzer; shift ;;
        --analyzer-address) SET_ANALYZER="${2:?--analyzer-address needs HOST:PORT}"; shift 2 ;;
        --analyzer-address=*) SET_ANALYZER="${1#--analyzer-address=}"; shift ;;
        --metrics-textfile) SET_TEXTFILE="${2:?--metrics-textfile needs a path}"; shift 2 ;;
        --metrics-textfile=*) SET_TEXTFILE="${1#--metrics-textfile=}"; shift ;;
        -h|--help) sed -n '2,32p' "$0"; exit 0 ;;
        *) echo "install-node.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
    esac
done

DID=()
MISSING=()
say() { echo "install-node: $*"; }
did() { DID+=("$*"); say "$*"; }
missing() { MISSING+=("$*"); say "MISSING: $*"; }

KREL="$(uname -r)"
SYS_PY=/usr/bin/python3
DIST_BCC=/usr/lib/python3/dist-packages/bcc

if [ "$(id -u)" != 0 ] && [ "$CHECK" = 0 ]; then
    echo "install-node.sh: must run as root (it installs packages, links kernel headers and" \
         "mounts tracefs). Fix: sudo bash $0 $*" >&2
    exit 1
fi

# ---- distribution --------------------------------------------------------------------------
ID=""; ID_LIKE=""
[ -r /etc/os-release ] && . /etc/os-release
case " $ID $ID_LIKE " in
    *" debian "*|*" ubuntu "*) ;;
    *) say "warning: /etc/os-release says ID='$ID'; only Debian and Ubuntu are supported (continuing)" ;;
esac
ARCH="$(dpkg --print-architecture 2>/dev/null || echo amd64)"
if [ "$ID" = ubuntu ]; then GENERIC_HDR=linux-headers-generic; HDR_FLAVOUR=generic
else GENERIC_HDR="linux-headers-$ARCH"; HDR_FLAVOUR="$ARCH"; fi

bcc_ok() { [ -d "$DIST_BCC" ] && "$SYS_PY" -c 'import bcc' >/dev/null 2>&1; }
headers_ok() { [ -e "/lib/modules/$KREL/build/include/linux/kconfig.h" ] || \
               [ -e "/lib/modules/$KREL/source/include/linux/kconfig.h" ]; }

APT_UPDATED=0
apt_install() {   # apt_install PKG...: install what is not installed yet
    local need=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || need+=("$p")
    done
    [ ${#need[@]} = 0 ] && return 0
    if [ "$NO_APT" = 1 ] || [ "$CHECK" = 1 ]; then
        missing "packages ${need[*]} (fix: apt-get install -y ${need[*]})"; return 1
    fi
    if [ "$APT_UPDATED" = 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq || say "warning: apt-get update failed"
        APT_UPDATED=1
    fi
    if DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; then
        did "installed ${need[*]}"
    else
        missing "packages ${need[*]}: apt-get install failed (fix: check network/proxy, or install them by hand)"
        return 1
    fi
}

# ---- hypertrace itself (--agent / --analyzer) ----------------------------------------------
install_hypertrace() {
    local venv="$PREFIX/.venv" unit="hypertrace-$ROLE.service"
    if [ "$CHECK" = 1 ]; then
        [ -x "$venv/bin/hypertrace" ] || missing "$venv/bin/hypertrace (fix: bash $0 --$ROLE)"
        [ -e "/etc/systemd/system/$unit" ] || missing "/etc/systemd/system/$unit (fix: bash $0 --$ROLE)"
        return
    fi
    if [ ! -f "$REPO/setup.cfg" ]; then
        missing "the hypertrace checkout next to this script ($REPO has no setup.cfg)"; return
    fi
    "$SYS_PY" -c 'import ensurepip, venv' >/dev/null 2>&1 || apt_install python3-venv || return
    if [ ! -x "$venv/bin/python" ]; then
        mkdir -p "$PREFIX" && "$SYS_PY" -m venv "$venv" && did "created the venv $venv" \
            || { missing "venv $venv could not be created"; return; }
    fi
    # pip builds a local project in its own folder (build/, *.egg-info): build from a copy, so
    # the checkout stays as it was (it may be read-only, or shared).
    local src
    src="$(mktemp -d /tmp/hypertrace-src.XXXXXX)"
    tar -C "$REPO" --exclude=./.git --exclude=./.venv --exclude=./build --exclude='*.egg-info' \
        --exclude=./tests/.build --exclude=./.cache -cf - . | tar -C "$src" -xf -
    if "$venv/bin/pip" install -q --disable-pip-version-check "$src" >/tmp/hypertrace-pip.log 2>&1; then
        did "installed $("$venv/bin/hypertrace" --version 2>/dev/null) into $venv"
        rm -rf "$src"
    else
        rm -rf "$src"
        missing "pip install of $REPO into $venv failed (see /tmp/hypertrace-pip.log)"; return
    fi
    install -m 0644 "$REPO/README.md" "$PREFIX/README.md"
    install -d -m 0755 /etc/hypertrace
    install -d -m 0700 /etc/hypertrace/pki
    install -d -m 0755 /etc/systemd/system
    install -m 0644 "$REPO/deploy/$unit" "/etc/systemd/system/$unit"
    did "installed /etc/systemd/system/$unit and /etc/hypertrace (pki/ 0700)"
    if [ "$ROLE" = agent ]; then
        if [ -e /etc/hypertrace/agent.toml ]; then
            say "/etc/hypertrace/agent.toml: present, kept"
        else
            install -m 0640 "$REPO/deploy/agent.toml.example" /etc/hypertrace/agent.toml
            did "wrote /etc/hypertrace/agent.toml from deploy/agent.toml.example (set analyzer and the tls_* files)"
        fi
        install -d -m 0700 /var/lib/hypertrace /var/lib/hypertrace/spool
        if [ -n "$SET_ANALYZER" ]; then
            set_key analyzer "$SET_ANALYZER"
        elif grep -q '^analyzer = "analyzer.example.internal:50051"' /etc/hypertrace/agent.toml; then
            say "note: set the analyzer's HOST:PORT in /etc/hypertrace/agent.toml (or --analyzer-address)"
        fi
        if [ -n "$SET_TEXTFILE" ]; then
            install -d -m 0755 "$(dirname "$SET_TEXTFILE")"
            set_key metrics_textfile "$SET_TEXTFILE"
        fi
        VENV="$venv"                  # the venv section below makes bcc importable from it
    else
        if [ -e /etc/hypertrace/analyzer.toml ]; then
            say "/etc/hypertrace/analyzer.toml: present, kept"
        else
            install -m 0644 "$REPO/deploy/analyzer.toml.example" /etc/hypertrace/analyzer.toml
            did "wrote /etc/hypertrace/analyzer.toml from deploy/analyzer.toml.example (eviction: dry run)"
        fi
    fi
}

set_key() {   # set_key KEY VALUE: KEY = "VALUE" in /etc/hypertrace/agent.toml
    local key="$1" value="$2" f=/etc/hypertrace/agent.toml
    case "$value" in *'"'*|*'\'*|*$'\n'*) missing "$key: no quotes, backslashes or newlines in '$value'"; return ;; esac
    if grep -q "^$key = " "$f"; then
        sed -i "s|^$key = .*|$key = \"${value//|/\\|}\"|" "$f"
    else
        printf '%s = "%s"\n' "$key" "$value" >> "$f"
    fi
    did "set $key = \"$value\" in $f"
}

if [ "$ROLE" != analyzer ]; then
# ---- bcc -----------------------------------------------------------------------------------
if bcc_ok; then say "bcc: present ($DIST_BCC)"
else apt_install python3-bpfcc bpfcc-tools && { bcc_ok || missing "bcc still not importable by $SYS_PY after install"; }
fi

# ---- kernel headers ------------------------------------------------------------------------
if headers_ok; then
    say "kernel headers: present (/lib/modules/$KREL/build)"
else
    # Prefer the exact headers for this kernel; fall back to the distribution's generic ones.
    if [ "$NO_APT" = 0 ] && [ "$CHECK" = 0 ] && apt-cache show "linux-headers-$KREL" >/dev/null 2>&1; then
        apt_install "linux-headers-$KREL"
    fi
    if ! headers_ok; then
        ls -d /usr/src/linux-headers-*-"$HDR_FLAVOUR" >/dev/null 2>&1 || apt_install "$GENERIC_HDR"
        BUILD="$(ls -d /usr/src/linux-headers-*-"$HDR_FLAVOUR" 2>/dev/null | sort -V | tail -n1)"
        if [ -n "$BUILD" ]; then
            # Debian: foo-amd64 pairs with foo-common; Ubuntu: foo-generic pairs with foo.
            if [ "$HDR_FLAVOUR" = generic ]; then SRC="${BUILD%-generic}"; else SRC="${BUILD%-$HDR_FLAVOUR}-common"; fi
            [ -d "$SRC" ] || SRC="$BUILD"
            if [ "$CHECK" = 1 ]; then
                missing "/lib/modules/$KREL/build link (fix: ln -sfn $BUILD /lib/modules/$KREL/build; ln -sfn $SRC /lib/modules/$KREL/source)"
            else
                mkdir -p "/lib/modules/$KREL"
                ln -sfn "$BUILD" "/lib/modules/$KREL/build"
                ln -sfn "$SRC" "/lib/modules/$KREL/source"
                did "no packaged headers for kernel $KREL: linked /lib/modules/$KREL/build -> $BUILD, source -> $SRC"
            fi
        fi
        headers_ok || [ "$CHECK" = 1 ] || missing "kernel headers for $KREL (fix: apt-get install linux-headers-$KREL, or $GENERIC_HDR and link /lib/modules/$KREL/build to it)"
    fi
fi

# ---- tracefs -------------------------------------------------------------------------------
# Read the mount table: /sys/kernel/tracing is root-only, so a user's -e test says "missing"
# for a tracefs that is there.
tracefs_mounted() {
    awk '$3 == "tracefs" { found = 1 } END { exit !found }' /proc/mounts 2>/dev/null ||
        [ -e /sys/kernel/tracing/uprobe_events ] || [ -e /sys/kernel/debug/tracing/uprobe_events ]
}
if tracefs_mounted; then
    say "tracefs: mounted"
elif [ "$CHECK" = 1 ]; then
    missing "tracefs (fix: mount -t tracefs nodev /sys/kernel/tracing)"
elif mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null; then
    did "mounted tracefs at /sys/kernel/tracing (not persistent: add 'tracefs /sys/kernel/tracing tracefs defaults 0 0' to /etc/fstab to keep it across reboots)"
else
    missing "tracefs could not be mounted (fix: mount -t tracefs nodev /sys/kernel/tracing; in a container run privileged or mount it from the host)"
fi

fi   # eBPF prerequisites

[ -n "$ROLE" ] && install_hypertrace

# ---- virtualenv ----------------------------------------------------------------------------
if [ -n "$VENV" ]; then
    VPY="$VENV/bin/python"
    if [ ! -x "$VPY" ]; then
        missing "virtualenv $VENV (no $VPY; fix: python3 -m venv $VENV, or make venv)"
    elif "$VPY" -c 'import bcc' >/dev/null 2>&1; then
        say "venv $VENV: bcc importable"
    elif [ ! -d "$DIST_BCC" ]; then
        missing "bcc for venv $VENV: $DIST_BCC does not exist (install python3-bpfcc first)"
    elif [ "$CHECK" = 1 ]; then
        missing "bcc not importable from venv $VENV (fix: bash $0 --venv $VENV)"
    else
        SITE="$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
        SHIM="$VENV/hypertrace-system-bcc"
        mkdir -p "$SHIM"
        ln -sfn "$DIST_BCC" "$SHIM/bcc"
        echo "$(cd "$SHIM" && pwd)" > "$SITE/hypertrace-system-bcc.pth"
        if "$VPY" -c 'import bcc' >/dev/null 2>&1; then
            did "venv $VENV: bcc importable via $SHIM (symlink to $DIST_BCC only) and $SITE/hypertrace-system-bcc.pth"
        else
            missing "bcc still not importable from $VENV: $("$VPY" -c 'import bcc' 2>&1 | tail -n1)"
        fi
    fi
fi

# ---- summary -------------------------------------------------------------------------------
if [ ${#DID[@]} = 0 ] && [ ${#MISSING[@]} = 0 ]; then
    say "nothing to do: everything was already in place"
fi
if [ ${#MISSING[@]} != 0 ]; then
    say "${#MISSING[@]} prerequisite(s) missing; the eBPF probes will not work until fixed:"
    for m in "${MISSING[@]}"; do echo "  - $m"; done
    exit 1
fi
case "$ROLE" in
    agent) say "ready: the agent is installed. Next: ca.crt, agent.crt and agent.key in /etc/hypertrace/pki, the analyzer in /etc/hypertrace/agent.toml, then systemctl daemon-reload && systemctl enable --now hypertrace-agent" ;;
    analyzer) say "ready: the analyzer is installed. Next: ca.crt, analyzer.crt and analyzer.key in /etc/hypertrace/pki (the unit names them), then systemctl daemon-reload && systemctl enable --now hypertrace-analyzer" ;;
    *) say "ready: bcc, kernel headers and tracefs are in place" ;;
esac
exit 0
