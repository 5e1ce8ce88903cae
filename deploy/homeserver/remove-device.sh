#!/usr/bin/env bash
# Remove a device from the home server's broker and from the running job: its MQTT password and
# its ACL lines go, and its id is appended to the coordinator's removed-devices file (the
# coordinator reads it within seconds: the device is never sampled again, may not register again,
# and its entities are cleared from Home Assistant). The opposite of add-device.sh NAME.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=acl-users.sh
. "$SCRIPT_DIR/acl-users.sh"

PASSWD=${EDGEFL_PASSWD_FILE:-/etc/mosquitto/edgefl.passwd}
ACL=""
REMOVED=${EDGEFL_REMOVED_DEVICES:-/var/lib/edgefl-coordinator/removed-devices}
RELOAD=1
NAME=""

usage() {
    cat <<'USAGE'
usage: remove-device.sh [options] NAME     NAME is the device id (and MQTT username) add-device.sh made
  --passwd FILE      mosquitto password file (default /etc/mosquitto/edgefl.passwd)
  --acl FILE         mosquitto ACL file (default edgefl.acl next to the password file)
  --removed FILE     the coordinator's removed-devices file (coordinator.toml's removed_devices;
                     default /var/lib/edgefl-coordinator/removed-devices)
  --no-reload        do not reload mosquitto (it re-reads users and the ACL on SIGHUP / reload)
USAGE
}

die() { echo "remove-device.sh: error: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case $1 in
        --passwd) PASSWD=${2:?--passwd needs a file}; shift ;;
        --acl) ACL=${2:?--acl needs a file}; shift ;;
        --removed) REMOVED=${2:?--removed needs a file}; shift ;;
        --no-reload) RELOAD=0 ;;
        -h|--help) usage; exit 0 ;;
        -*) usage >&2; die "unknown option $1" ;;
        *) [ -z "$NAME" ] || die "one NAME only"; NAME=$1 ;;
    esac
    shift
done

[ -n "$NAME" ] || { usage >&2; die "NAME is required"; }
[[ $NAME =~ ^[A-Za-z0-9_.-]{1,128}$ ]] || die "invalid name '$NAME': use 1-128 of [A-Za-z0-9_.-]"
ACL=${ACL:-$(dirname "$PASSWD")/edgefl.acl}
[ -f "$PASSWD" ] || die "no password file $PASSWD"
command -v mosquitto_passwd >/dev/null || die "mosquitto_passwd not found (apt install mosquitto)"
if [ -f "$ACL" ] && [ "$(user_role "$ACL" "$NAME")" != device ]; then
    die "'$NAME' is not a device in $ACL (a coordinator's or Home Assistant's user)"
fi
grep -q "^$NAME:" "$PASSWD" || die "no user '$NAME' in $PASSWD"

mosquitto_passwd -D "$PASSWD" "$NAME"
echo "==> user $NAME removed from $PASSWD"
if [ -f "$ACL" ] && grep -qxF "user $NAME" "$ACL"; then
    # its block (the `user NAME` line up to the next `user` line or a blank line) and the blank line before it
    TMP=$(mktemp "$ACL.XXXXXX")
    awk -v u="user $NAME" '
        $0 == u { skip = 1; if (held) held = 0; next }
        skip && (/^user / || /^$/) { skip = 0 }
        skip { next }
        held { print ""; held = 0 }
        /^$/ { held = 1; next }
        { print }
        END { if (held) print "" }' "$ACL" > "$TMP"
    chmod --reference="$ACL" "$TMP" 2>/dev/null || true
    mv "$TMP" "$ACL"
    echo "==> $NAME's lines removed from $ACL"
fi
mkdir -p "$(dirname "$REMOVED")"
printf '%s\n' "$NAME" >> "$REMOVED"
chmod 0644 "$REMOVED"
echo "==> $NAME appended to $REMOVED: the coordinator takes it out of the job and out of Home Assistant"

if [ "$RELOAD" = 1 ]; then
    reload_mosquitto " (a connection open now stays open until it drops: passwords are checked at connect)"
fi
