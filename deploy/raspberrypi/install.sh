#!/usr/bin/env bash
# Install (or remove) the edgefl device client as a systemd service on a Raspberry Pi,
# a Jetson or any 64-bit Linux box. Safe to run again: it only changes what differs.
# See docs/deploy.md. Run `install.sh --help` for the options.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO_DIR=$(cd "$SCRIPT_DIR/../.." && pwd)

ROOT=${EDGEFL_ROOT:-/}
PREFIX=/opt/edgefl
CONF_DIR=/etc/edgefl
STATE_DIR=/var/lib/edgefl
UNIT_DIR=/etc/systemd/system
SERVICE=edgefl-client.service
SVC_USER=edgefl
PYTHON=${EDGEFL_PYTHON:-python3}
SOURCE=$REPO_DIR
# PyPI's aarch64 torch wheels are CPU-only up to 2.10 and CUDA builds (several GB of NVIDIA
# wheels) from 2.11 on; 2.10.0 dies with SIGILL on ARMv8.0 CPUs (Pi 3/4, Zero 2 W).
TORCH_SPEC="torch>=2.2,<2.10"
TORCH_INDEX=""
WITH_ORT=0
SERVE_ONLY=0
SYSTEM_SITE=0
BUNDLE=""
MEMORY_MAX=""
START=1
FORCE=0
ACTION=install
PURGE=0
NEEDS_EDIT=0
read -r -a PIP_OPTS <<< "${EDGEFL_PIP_OPTS:-}"

usage() {
    cat <<'EOF'
usage: install.sh [options]              install or upgrade, enable and start edgefl-client
       install.sh --uninstall [--purge]  stop and remove it (--purge: also config, state, user)

  --bundle DIR          device bundle from the home server's add-device.sh (client.toml,
                        password, ca.crt, model-signing.pub) to install into /etc/edgefl
  --source SPEC         what pip installs as edgefl (default: this checkout)
  --torch SPEC          torch requirement (default "torch>=2.2,<2.10"); "skip" keeps what the
                        venv sees already (e.g. JetPack's torch with --system-site-packages)
  --torch-index URL     index for torch only, e.g. https://download.pytorch.org/whl/cpu
  --with-onnxruntime    also install onnxruntime for `edgefl predict` and `edgefl serve`
  --serve-only          a device that only serves its model (`edgefl serve`): onnxruntime, no torch
  --system-site-packages  let the venv see system packages (Jetson: NVIDIA's torch)
  --memory-max SIZE     systemd MemoryMax= for the service (e.g. 800M)
  --no-start            enable the service but do not start it now
  --python PATH         interpreter for the venv (default python3, needs >= 3.10)
  --root DIR            install into a staging tree; users and systemctl are only printed
  --force               install on an unknown architecture / overwrite config from --bundle
Environment: EDGEFL_PIP_OPTS (extra pip options), EDGEFL_ROOT, EDGEFL_PYTHON.
EOF
}

die() { echo "install.sh: error: $*" >&2; exit 1; }
say() { echo "==> $*"; }

while [ $# -gt 0 ]; do
    case $1 in
        --bundle) BUNDLE=${2:?--bundle needs a directory}; shift ;;
        --source) SOURCE=${2:?--source needs a value}; shift ;;
        --torch) TORCH_SPEC=${2:?--torch needs a value}; shift ;;
        --torch-index) TORCH_INDEX=${2:?--torch-index needs a URL}; shift ;;
        --with-onnxruntime) WITH_ORT=1 ;;
        --serve-only) SERVE_ONLY=1; WITH_ORT=1; TORCH_SPEC=skip ;;
        --system-site-packages) SYSTEM_SITE=1 ;;
        --memory-max) MEMORY_MAX=${2:?--memory-max needs a size}; shift ;;
        --no-start) START=0 ;;
        --python) PYTHON=${2:?--python needs a path}; shift ;;
        --root) ROOT=${2:?--root needs a directory}; shift ;;
        --force) FORCE=1 ;;
        --uninstall) ACTION=uninstall ;;
        --purge) PURGE=1 ;;
        -h|--help) usage; exit 0 ;;
        *) usage >&2; die "unknown option $1" ;;
    esac
    shift
done

ROOT=${ROOT%/}
STAGING=0
[ -n "$ROOT" ] && STAGING=1
VENV=$ROOT$PREFIX/venv

# System changes (users, ownership, systemctl) run for real only on the live system.
system() {
    if [ "$STAGING" = 1 ]; then
        echo "[staging] would run: $*"
    else
        "$@"
    fi
}

check_platform() {
    local arch
    arch=${EDGEFL_UNAME_M:-$(uname -m)}
    case $arch in
        aarch64|arm64|x86_64) say "architecture $arch" ;;
        armv6l|armv7l|armhf)
            die "this is a 32-bit ARM system ($arch); there are no torch wheels for it." \
                "Install the 64-bit Raspberry Pi OS (or another aarch64 OS)." ;;
        *)
            [ "$FORCE" = 1 ] || die "untested architecture $arch (use --force to try anyway)" ;;
    esac
    local version
    version=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) \
        || die "cannot run $PYTHON; install Python 3.10 or newer"
    case $version in
        3.1[0-9]|3.[2-9][0-9]) say "Python $version" ;;
        *) die "Python $version is too old: edgefl needs 3.10+ (Raspberry Pi OS Bookworm has 3.11, JetPack 6 3.10)" ;;
    esac
    "$PYTHON" -c 'import venv, ensurepip' 2>/dev/null \
        || die "$PYTHON cannot create virtual environments: apt install python3-venv"
}

ensure_user() {
    if [ "$STAGING" = 0 ] && getent passwd "$SVC_USER" >/dev/null; then
        say "system user $SVC_USER exists"
        return
    fi
    system useradd --system --user-group --home-dir "$STATE_DIR" --no-create-home \
        --shell /usr/sbin/nologin "$SVC_USER"
}

# install_file SRC DEST MODE OWNER: copy only when the content or mode differs.
install_file() {
    local src=$1 dest=$ROOT$2 mode=$3 owner=$4
    mkdir -p "$(dirname "$dest")"
    if [ -f "$dest" ] && cmp -s "$src" "$dest"; then
        chmod "$mode" "$dest"
    else
        install -m "$mode" "$src" "$dest"
        say "installed $2"
    fi
    system chown "$owner" "$dest"
}

install_venv() {
    if [ -x "$VENV/bin/python" ]; then
        say "virtual environment $PREFIX/venv exists"
    else
        local flags=()
        [ "$SYSTEM_SITE" = 1 ] && flags+=(--system-site-packages)
        "$PYTHON" -m venv "${flags[@]}" "$VENV"
        say "created virtual environment $PREFIX/venv"
    fi
    # What was installed last time; a wheel file or spec already installed is not fetched again.
    local marker=$VENV/.edgefl-install wanted
    wanted="torch=$TORCH_SPEC index=$TORCH_INDEX onnxruntime=$WITH_ORT serve_only=$SERVE_ONLY source=$SOURCE"
    if [ -f "$SOURCE" ]; then
        wanted+=" sha256=$(sha256sum "$SOURCE" | cut -d' ' -f1)"
    elif [ -e "$SOURCE" ]; then
        wanted+=" mtime=$(date +%s)"  # a source tree is always reinstalled
    fi
    if [ -f "$marker" ] && [ "$(cat "$marker")" = "$wanted" ] && [ -x "$VENV/bin/edgefl" ]; then
        say "edge SDK up to date in $PREFIX/venv"
        return
    fi
    local pip=("$VENV/bin/python" -m pip install --disable-pip-version-check -q "${PIP_OPTS[@]}")
    if [ "$TORCH_SPEC" != skip ]; then
        local index=()
        [ -n "$TORCH_INDEX" ] && index=(--index-url "$TORCH_INDEX")
        say "installing $TORCH_SPEC"
        "${pip[@]}" "${index[@]}" "$TORCH_SPEC"
    fi
    say "installing the edge SDK from $SOURCE (numpy, paho-mqtt, msgpack, cryptography only)"
    "${pip[@]}" --upgrade-strategy only-if-needed "$SOURCE"
    if [ "$WITH_ORT" = 1 ]; then
        say "installing onnxruntime"
        "${pip[@]}" "onnxruntime>=1.17"
    fi
    local rc=0 why check='import torch, edge_sdk.client'
    [ "$SERVE_ONLY" = 1 ] && check='import onnxruntime, edge_sdk.serving.serve_command'
    why=$("$VENV/bin/python" -c "$check" 2>&1) || rc=$?
    if [ "$rc" = 132 ]; then
        die "torch dies with 'Illegal instruction' on this CPU (ARMv8.0, e.g. Pi 3/4)." \
            "Use --torch 'torch==2.9.1', or torch>=2.11 from --torch-index https://download.pytorch.org/whl/cpu"
    elif [ "$rc" != 0 ]; then
        die "the edge SDK does not import: ${why##*$'\n'}; see docs/deploy.md, Troubleshooting"
    fi
    [ -x "$VENV/bin/edgefl" ] || die "pip did not install the edgefl command"
    echo "$wanted" > "$marker"
}

install_config() {
    mkdir -p "$ROOT$CONF_DIR"
    chmod 0750 "$ROOT$CONF_DIR"
    system chown "root:$SVC_USER" "$ROOT$CONF_DIR"
    local conf=$ROOT$CONF_DIR/client.toml
    if [ -n "$BUNDLE" ]; then
        [ -f "$BUNDLE/client.toml" ] || die "$BUNDLE has no client.toml (make one with add-device.sh)"
        # Replace the example config, never one you edited (unless --force).
        if [ -f "$conf" ] && ! cmp -s "$BUNDLE/client.toml" "$conf" \
                && ! cmp -s "$SCRIPT_DIR/client.toml" "$conf" && [ "$FORCE" = 0 ]; then
            install -m 0640 "$BUNDLE/client.toml" "$conf.new"
            say "kept your $CONF_DIR/client.toml; the bundle's is $CONF_DIR/client.toml.new (--force overwrites)"
        else
            install_file "$BUNDLE/client.toml" "$CONF_DIR/client.toml" 0640 "root:$SVC_USER"
        fi
        if [ -f "$BUNDLE/password" ]; then
            install_file "$BUNDLE/password" "$CONF_DIR/password" 0640 "root:$SVC_USER"
        fi
        if [ -f "$BUNDLE/serve.password" ]; then  # the serving connection's user (add-device.sh --reads)
            install_file "$BUNDLE/serve.password" "$CONF_DIR/serve.password" 0640 "root:$SVC_USER"
        fi
        if [ -f "$BUNDLE/ca.crt" ]; then
            install_file "$BUNDLE/ca.crt" "$CONF_DIR/ca.crt" 0644 root:root
        fi
        # the coordinator's public key, where the bundle's client.toml trusts it ([security])
        if [ -f "$BUNDLE/model-signing.pub" ]; then
            install_file "$BUNDLE/model-signing.pub" "$CONF_DIR/model-signing.pub" 0644 root:root
        fi
    elif [ ! -f "$conf" ]; then
        install_file "$SCRIPT_DIR/client.toml" "$CONF_DIR/client.toml" 0640 "root:$SVC_USER"
        NEEDS_EDIT=1
    fi
    chmod 0640 "$conf"
    if [ -z "$BUNDLE" ] && grep -q '^device_id = "pi-kitchen"' "$conf"; then
        NEEDS_EDIT=1  # still the example config
    fi
}

install_unit() {
    install_file "$SCRIPT_DIR/edgefl-client.service" "$UNIT_DIR/$SERVICE" 0644 root:root
    local dropin=$ROOT$UNIT_DIR/$SERVICE.d/limits.conf
    if [ -n "$MEMORY_MAX" ]; then
        mkdir -p "$(dirname "$dropin")"
        printf '[Service]\nMemoryMax=%s\n' "$MEMORY_MAX" > "$dropin"
        say "MemoryMax=$MEMORY_MAX in $UNIT_DIR/$SERVICE.d/limits.conf"
    fi
    local serve=$ROOT$UNIT_DIR/$SERVICE.d/serve-only.conf
    if [ "$SERVE_ONLY" = 1 ]; then  # the same unit and sandbox, running `edgefl serve` instead of the client
        mkdir -p "$(dirname "$serve")"
        printf '[Service]\nExecStart=\nExecStart=%s/bin/edgefl -v serve --config %s/client.toml\n' \
            "$PREFIX/venv" "$CONF_DIR" > "$serve"
        say "serve only: edgefl serve in $UNIT_DIR/$SERVICE.d/serve-only.conf"
    else
        rm -f "$serve"
    fi
    mkdir -p "$ROOT$STATE_DIR"
    chmod 0750 "$ROOT$STATE_DIR"
    system chown "$SVC_USER:$SVC_USER" "$ROOT$STATE_DIR"
}

start_service() {
    system systemctl daemon-reload
    if [ "$START" = 0 ] || [ "$NEEDS_EDIT" = 1 ]; then
        system systemctl enable "$SERVICE"
        if [ "$NEEDS_EDIT" = 1 ]; then
            say "edit $CONF_DIR/client.toml, then: systemctl start edgefl-client"
        fi
        return
    fi
    local was_active=0
    if [ "$STAGING" = 0 ] && systemctl is-active --quiet "$SERVICE"; then
        was_active=1
    fi
    system systemctl enable --now "$SERVICE"
    if [ "$was_active" = 1 ]; then
        system systemctl restart "$SERVICE"  # pick up new code and config
    fi
    say "running; follow it with: journalctl -u edgefl-client -f"
}

uninstall() {
    system systemctl disable --now "$SERVICE" || true
    local unit=$ROOT$UNIT_DIR/$SERVICE
    rm -rf "$unit" "$unit.d" "$ROOT$PREFIX"
    system systemctl daemon-reload
    say "removed the service and $PREFIX"
    if [ "$PURGE" = 1 ]; then
        rm -rf "$ROOT$CONF_DIR" "$ROOT$STATE_DIR"
        if [ "$STAGING" = 1 ] || getent passwd "$SVC_USER" >/dev/null; then
            system userdel "$SVC_USER"
        fi
        say "purged $CONF_DIR, $STATE_DIR and the $SVC_USER user"
    else
        say "kept $CONF_DIR and $STATE_DIR (--purge removes them)"
    fi
}

if [ "$STAGING" = 0 ] && [ "$(id -u)" != 0 ]; then
    die "run as root (sudo $0 ...), or use --root DIR to stage the files"
fi
if [ "$ACTION" = uninstall ]; then
    uninstall
    exit 0
fi
check_platform
ensure_user
install_venv
install_config
install_unit
start_service
