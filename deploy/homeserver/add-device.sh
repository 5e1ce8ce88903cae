#!/usr/bin/env bash
# Add a device (or the coordinator) to the home server's broker: an MQTT user with a fresh
# random password, the device's lines in the ACL, and a bundle for the device (client.toml,
# password, ca.crt) to copy to it and install with `install.sh --bundle DIR`. Running it again
# for a name changes its password.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TEMPLATE=$SCRIPT_DIR/../raspberrypi/client.toml
PASSWD=${EDGEFL_PASSWD_FILE:-/etc/mosquitto/edgefl.passwd}
CA=${EDGEFL_CA_FILE:-/etc/mosquitto/certs/ca.crt}
ACL=""
URL=""
JOB=home
OUT=""
ROLE=device
RELOAD=1
NAME=""

usage() {
    cat <<'EOF'
usage: add-device.sh [options] NAME     a device; NAME is its device id and MQTT username
       add-device.sh --coordinator      the coordinator's MQTT user ("coordinator")
  --broker-url URL   what the device connects to (default mqtts://<this host's FQDN>:8883)
  --job NAME         job name in the device's client.toml (default home)
  --out DIR          bundle directory (default ./edgefl-devices/NAME)
  --passwd FILE      mosquitto password file (default /etc/mosquitto/edgefl.passwd)
  --acl FILE         mosquitto ACL file (default edgefl.acl next to the password file); made
                     from deploy/homeserver/edgefl.acl if missing; a device gets a `user` block
  --ca FILE          CA certificate for the bundle (default /etc/mosquitto/certs/ca.crt)
  --no-reload        do not reload mosquitto (it re-reads users and the ACL on SIGHUP / reload)
EOF
}

die() { echo "add-device.sh: error: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case $1 in
        --coordinator) ROLE=coordinator; NAME=coordinator ;;
        --broker-url) URL=${2:?--broker-url needs a URL}; shift ;;
        --job) JOB=${2:?--job needs a name}; shift ;;
        --out) OUT=${2:?--out needs a directory}; shift ;;
        --passwd) PASSWD=${2:?--passwd needs a file}; shift ;;
        --ca) CA=${2:?--ca needs a file}; shift ;;
        --acl) ACL=${2:?--acl needs a file}; shift ;;
        --no-reload) RELOAD=0 ;;
        -h|--help) usage; exit 0 ;;
        -*) usage >&2; die "unknown option $1" ;;
        *) [ -z "$NAME" ] || die "one NAME only"; NAME=$1 ;;
    esac
    shift
done

[ -n "$NAME" ] || { usage >&2; die "NAME is required"; }
ID_RE='^[A-Za-z0-9_.-]{1,128}$'
[[ $NAME =~ $ID_RE ]] || die "invalid name '$NAME': use 1-128 of [A-Za-z0-9_.-]"
[[ $JOB =~ $ID_RE ]] || die "invalid job name '$JOB'"
if [ "$ROLE" = device ] && [ "$NAME" = coordinator ]; then
    die "'coordinator' is reserved for the coordinator (use --coordinator)"
fi
URL=${URL:-mqtts://$(hostname -f 2>/dev/null || hostname):8883}
URL_RE='^mqtts?://[][A-Za-z0-9.:_-]+$'
[[ $URL =~ $URL_RE ]] || die "invalid broker URL '$URL'"
command -v mosquitto_passwd >/dev/null || die "mosquitto_passwd not found (apt install mosquitto)"
OUT=${OUT:-./edgefl-devices/$NAME}
ACL=${ACL:-$(dirname "$PASSWD")/edgefl.acl}
[ -f "$ACL" ] || [ -f "$SCRIPT_DIR/edgefl.acl" ] || die "template $SCRIPT_DIR/edgefl.acl is missing"

umask 077
RAW=$(head -c 48 /dev/urandom | base64 -w0 | tr -dc 'A-Za-z0-9')
PASSWORD=${RAW:0:32}
[ ${#PASSWORD} -ge 24 ] || die "could not generate a password"

mkdir -p "$(dirname "$PASSWD")"
create=()
[ -f "$PASSWD" ] || create=(-c)
# The password goes through stdin, never onto a command line (ps would show it).
printf '%s\n%s\n' "$PASSWORD" "$PASSWORD" | mosquitto_passwd "${create[@]}" "$PASSWD" "$NAME" >/dev/null
if getent group mosquitto >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    chgrp mosquitto "$PASSWD"
    chmod 0640 "$PASSWD"
fi

# The ACL: patterns with %u cover a device's own topics; the job-wide broadcast has no %u in
# it, so each device gets its own line for it (see edgefl.acl).
if [ ! -f "$ACL" ]; then
    mkdir -p "$(dirname "$ACL")"
    install -m 0644 "$SCRIPT_DIR/edgefl.acl" "$ACL"
    echo "==> made $ACL from $SCRIPT_DIR/edgefl.acl"
fi
if [ "$ROLE" = device ] && ! grep -qxF "user $NAME" "$ACL"; then
    printf '\nuser %s\ntopic read edgefl/+/coord\n' "$NAME" >> "$ACL"
    echo "==> $NAME may read the broadcast edgefl/+/coord ($ACL)"
fi

mkdir -p "$OUT"
chmod 0700 "$OUT"
if [ "$ROLE" = coordinator ]; then
    printf '%s\n' "$PASSWORD" > "$OUT/coordinator.password"
    chmod 0600 "$OUT/coordinator.password"
    echo "==> user coordinator in $PASSWD; its password is in $OUT/coordinator.password"
    echo "    install it as /etc/edgefl/coordinator.password (mode 0640, group edgefl-coordinator)"
else
    [ -f "$TEMPLATE" ] || die "template $TEMPLATE is missing"
    printf '%s\n' "$PASSWORD" > "$OUT/password"
    chmod 0600 "$OUT/password"
    sed -e "s|^device_id = \"[^\"]*\"|device_id = \"$NAME\"|" \
        -e "s|^job = \"[^\"]*\"|job = \"$JOB\"|" \
        -e "s|^username = \"[^\"]*\"|username = \"$NAME\"|" \
        -e "s|^url = \"[^\"]*\"|url = \"$URL\"|" \
        "$TEMPLATE" > "$OUT/client.toml"
    chmod 0600 "$OUT/client.toml"
    if [ -f "$CA" ]; then
        cp "$CA" "$OUT/ca.crt"
        chmod 0644 "$OUT/ca.crt"
    else
        echo "warning: no CA certificate at $CA; put the broker's CA in $OUT/ca.crt" >&2
    fi
    echo "==> user $NAME in $PASSWD; device bundle in $OUT"
    echo "    copy it to the device, then: sudo deploy/raspberrypi/install.sh --bundle DIR"
fi

if [ "$RELOAD" = 1 ]; then
    if command -v systemctl >/dev/null && systemctl is-active --quiet mosquitto 2>/dev/null; then
        systemctl reload mosquitto
        echo "==> reloaded mosquitto"
    else
        echo "==> reload mosquitto to apply (systemctl reload mosquitto)"
    fi
fi
