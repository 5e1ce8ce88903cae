#!/usr/bin/env bash
# Add a device (or the coordinator) to the home server's broker: an MQTT user with a fresh
# random password, the device's lines in the ACL, and a bundle for the device (client.toml,
# password, ca.crt, the coordinator's public key model-signing.pub) to copy to it and install
# with `install.sh --bundle DIR`. Running it again for a name changes its password. The
# coordinator's bundle also gets the Ed25519 key that signs published models (made once).
# --homeassistant makes Home Assistant's MQTT user (docs/homeassistant.md).
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=acl-users.sh
. "$SCRIPT_DIR/acl-users.sh"
TEMPLATE=$SCRIPT_DIR/../raspberrypi/client.toml
PASSWD=${EDGEFL_PASSWD_FILE:-/etc/mosquitto/edgefl.passwd}
CA=${EDGEFL_CA_FILE:-/etc/mosquitto/certs/ca.crt}
SIGNING_PUB=${EDGEFL_SIGNING_PUB:-/etc/edgefl/model-signing.pub}
ACL=""
URL=""
JOB=home
OUT=""
ROLE=device
RELOAD=1
NAME=""
READS=()

usage() {
    cat <<'EOF'
usage: add-device.sh [options] NAME     a device; NAME is its device id and MQTT username
       add-device.sh --coordinator [NAME]  a coordinator's MQTT user (default "coordinator"; another
                     name for a second job at once: each MQTT user holds one connection)
       add-device.sh --homeassistant [NAME]  Home Assistant's MQTT user (default "homeassistant"): it
                     reads the fleet's discovery, state and availability and writes the pause switch
  --broker-url URL   what the device connects to (default mqtts://<this host's FQDN>:8883)
  --job NAME         job name in the device's client.toml (default home)
  --out DIR          bundle directory (default ./edgefl-devices/NAME)
  --passwd FILE      mosquitto password file (default /etc/mosquitto/edgefl.passwd)
  --acl FILE         mosquitto ACL file (default edgefl.acl next to the password file); made
                     from deploy/homeserver/edgefl.acl if missing; a device gets a `user` block
  --ca FILE          CA certificate for the bundle (default /etc/mosquitto/certs/ca.crt)
  --signing-pub FILE the coordinator's public key for a device bundle (default
                     /etc/edgefl/model-signing.pub; made by --coordinator)
  --reads TOPIC      a device that serves (docs/serving.md): its serving connection's own MQTT user
                     NAME.serve (one connection a user: the broker takes the username as client id),
                     which writes its predictions, reads its corrections and this one sensor topic, e.g.
                     "zigbee2mqtt/Kitchen plug" (exact: no + or #; never zigbee2mqtt/#, which would
                     show it every door and presence sensor); once per topic, again to add more
  --no-reload        do not reload mosquitto (it re-reads users and the ACL on SIGHUP / reload)
EOF
}

die() { echo "add-device.sh: error: $*" >&2; exit 1; }

while [ $# -gt 0 ]; do
    case $1 in
        --coordinator) ROLE=coordinator ;;
        --homeassistant) ROLE=homeassistant ;;
        --broker-url) URL=${2:?--broker-url needs a URL}; shift ;;
        --job) JOB=${2:?--job needs a name}; shift ;;
        --out) OUT=${2:?--out needs a directory}; shift ;;
        --passwd) PASSWD=${2:?--passwd needs a file}; shift ;;
        --ca) CA=${2:?--ca needs a file}; shift ;;
        --signing-pub) SIGNING_PUB=${2:?--signing-pub needs a file}; shift ;;
        --acl) ACL=${2:?--acl needs a file}; shift ;;
        --reads) READS+=("${2:?--reads needs a topic}"); shift ;;
        --no-reload) RELOAD=0 ;;
        -h|--help) usage; exit 0 ;;
        -*) usage >&2; die "unknown option $1" ;;
        *) [ -z "$NAME" ] || die "one NAME only"; NAME=$1 ;;
    esac
    shift
done

[ "$ROLE" = device ] || NAME=${NAME:-$ROLE}
[ -n "$NAME" ] || { usage >&2; die "NAME is required"; }
ID_RE='^[A-Za-z0-9_.-]{1,128}$'
[[ $NAME =~ $ID_RE ]] || die "invalid name '$NAME': use 1-128 of [A-Za-z0-9_.-]"
[[ $JOB =~ $ID_RE ]] || die "invalid job name '$JOB'"
if [ "$ROLE" = device ] && { [ "$NAME" = coordinator ] || [ "$NAME" = homeassistant ]; }; then
    die "'$NAME' is reserved (use --$NAME)"
fi
[[ $NAME == *.serve ]] && die "'$NAME': names ending in .serve are a serving device's second user (--reads)"
[ ${#READS[@]} -eq 0 ] || [ "$ROLE" = device ] || die "--reads is for a device"
for topic in "${READS[@]}"; do
    [[ $topic =~ [+#] ]] && die "--reads '$topic': one exact topic, no + or # wildcards"
    [[ $topic =~ [[:cntrl:]\\] ]] && die "--reads: a topic without control characters or backslashes"
    [[ $topic =~ ^[[:space:]]|[[:space:]]$ ]] && die "--reads '$topic': no spaces at its ends"
    [[ $topic == edgefl/* || $topic == \$* || -z $topic || ${#topic} -gt 1024 ]] \
        && die "--reads '$topic': a sensor topic (edgefl's own topics are granted already)"
done
URL=${URL:-mqtts://$(hostname -f 2>/dev/null || hostname):8883}
URL_RE='^mqtts?://[][A-Za-z0-9.:_-]+$'
[[ $URL =~ $URL_RE ]] || die "invalid broker URL '$URL'"
command -v mosquitto_passwd >/dev/null || die "mosquitto_passwd not found (apt install mosquitto)"
OUT=${OUT:-./edgefl-devices/$NAME}
ACL=${ACL:-$(dirname "$PASSWD")/edgefl.acl}
[ -f "$ACL" ] || [ -f "$SCRIPT_DIR/edgefl.acl" ] || die "template $SCRIPT_DIR/edgefl.acl is missing"

# make_signing_key: the coordinator's Ed25519 key that signs published models, made once in
# OUT (PKCS8 PEM, mode 0600) with its public key beside it; kept when OUT has one already.
make_signing_key() {
    local key=$OUT/model-signing.key pub=$OUT/model-signing.pub
    if [ ! -f "$key" ]; then
        command -v openssl >/dev/null || { echo "warning: openssl not found; no model-signing key made" >&2; return 0; }
        openssl genpkey -algorithm ed25519 -out "$key" 2>/dev/null || die "openssl could not make an Ed25519 key"
        chmod 0600 "$key"
        echo "==> made the model-signing key $key"
    else
        echo "==> kept the model-signing key $key"
    fi
    openssl pkey -in "$key" -pubout -out "$pub" 2>/dev/null || die "$key is not a private key openssl reads"
    chmod 0644 "$pub"
    echo "    install it as /etc/edgefl/model-signing.key (mode 0640, group edgefl-coordinator), and its"
    echo "    public key $pub as /etc/edgefl/model-signing.pub: device bundles made after that carry it"
}

# bundle_signing_pub: the coordinator's public key into a device bundle, and client.toml told to trust it.
bundle_signing_pub() {
    if [ ! -f "$SIGNING_PUB" ]; then
        echo "warning: no coordinator public key at $SIGNING_PUB; this device will install published" \
             "models without checking who signed them (docs/deploy.md, \"Signed models\")" >&2
        return 0
    fi
    cp "$SIGNING_PUB" "$OUT/model-signing.pub"
    chmod 0644 "$OUT/model-signing.pub"
    sed -i 's|^# trusted_keys = |trusted_keys = |' "$OUT/client.toml"
    grep -q '^trusted_keys = ' "$OUT/client.toml" || die "$TEMPLATE has no '# trusted_keys = ' line"
}

# block_lines NAME: the topic lines of `user NAME` in the template ACL
block_lines() {
    [ -f "$SCRIPT_DIR/edgefl.acl" ] || die "template $SCRIPT_DIR/edgefl.acl is missing"
    awk -v u="user $1" '$0 == u { on = 1; next } /^user / { on = 0 } on && /^topic /' "$SCRIPT_DIR/edgefl.acl"
}
if [ "$ROLE" = device ] && [ -f "$SIGNING_PUB" ]; then
    if ! grep -q "BEGIN PUBLIC KEY" "$SIGNING_PUB" || grep -q "PRIVATE KEY" "$SIGNING_PUB"; then
        die "$SIGNING_PUB is not a PEM public key (give the coordinator's model-signing.pub)"
    fi
fi
# A name keeps its role: a device never gets a coordinator's or Home Assistant's ACL block, nor the reverse.
if [ -f "$ACL" ] && grep -qxF "user $NAME" "$ACL"; then
    HAS=$(user_role "$ACL" "$NAME")
    [ "$HAS" = "$ROLE" ] || die "'$NAME' is a $HAS user in $ACL, not a $ROLE"
fi

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
# --reads: the device's serving user NAME.serve (its own connection beside the device's), with the
# serving topics of NAME and a `topic read` line per sensor topic, once each
SERVE_USER=$NAME.serve
if [ ${#READS[@]} -gt 0 ]; then
    if ! grep -qxF "user $SERVE_USER" "$ACL"; then
        # the deny lines take back what the device patterns grant every username
        printf '\nuser %s\ntopic deny edgefl/+/up/#\ntopic deny edgefl/+/status/#\ntopic deny edgefl/+/down/#\n%s\n' \
            "$SERVE_USER" "topic deny edgefl/profile/#" >> "$ACL"
        printf 'topic write edgefl/+/predict/%s\ntopic write edgefl/+/predict/%s/+\ntopic read edgefl/+/correct/%s\n' \
            "$NAME" "$NAME" "$NAME" >> "$ACL"
        echo "==> $SERVE_USER serves for $NAME: its predictions and corrections ($ACL)"
    fi
    SERVE_PASSWORD=$(head -c 48 /dev/urandom | base64 -w0 | tr -dc 'A-Za-z0-9')
    SERVE_PASSWORD=${SERVE_PASSWORD:0:32}
    printf '%s\n%s\n' "$SERVE_PASSWORD" "$SERVE_PASSWORD" | mosquitto_passwd "$PASSWD" "$SERVE_USER" >/dev/null
fi
for topic in "${READS[@]}"; do
    line="topic read $topic"
    if ! awk -v u="user $SERVE_USER" -v t="$line" '$0 == u { on = 1; next } /^user / { on = 0 }
            on && $0 == t { found = 1 } END { exit !found }' "$ACL"; then
        awk -v u="user $SERVE_USER" -v t="$line" '{ print } $0 == u { print t }' "$ACL" > "$ACL.new"
        cat "$ACL.new" > "$ACL" && rm -f "$ACL.new"  # in place: the file keeps its owner and mode
        echo "==> $SERVE_USER may read $topic ($ACL)"
    fi
done
# Another coordinator user (a second job at once) gets the topic lines of `user coordinator`, another
# Home Assistant user those of `user homeassistant`.
if [ "$ROLE" != device ] && ! grep -qxF "user $NAME" "$ACL"; then
    LINES=$(block_lines "$ROLE")
    [ -n "$LINES" ] || die "$SCRIPT_DIR/edgefl.acl has no 'user $ROLE' block"
    printf '\nuser %s\n%s\n' "$NAME" "$LINES" >> "$ACL"
    echo "==> $NAME may do what user $ROLE does ($ACL)"
fi

mkdir -p "$OUT"
chmod 0700 "$OUT"
if [ "$ROLE" = coordinator ]; then
    printf '%s\n' "$PASSWORD" > "$OUT/coordinator.password"
    chmod 0600 "$OUT/coordinator.password"
    echo "==> user $NAME in $PASSWD; its password is in $OUT/coordinator.password"
    echo "    install it as /etc/edgefl/coordinator.password (mode 0640, group edgefl-coordinator)"
    [ "$NAME" = coordinator ] || echo "    and set username = \"$NAME\" in that job's coordinator.toml"
    make_signing_key
elif [ "$ROLE" = homeassistant ]; then
    printf '%s\n' "$PASSWORD" > "$OUT/homeassistant.password"
    chmod 0600 "$OUT/homeassistant.password"
    [ -f "$CA" ] && cp "$CA" "$OUT/ca.crt" && chmod 0644 "$OUT/ca.crt"
    echo "==> user $NAME in $PASSWD; its password is in $OUT/homeassistant.password"
    echo "    in Home Assistant: Settings > Devices & services > MQTT: broker $(hostname -f 2>/dev/null || hostname),"
    echo "    port 8883, username $NAME, that password, TLS with the CA $OUT/ca.crt (docs/homeassistant.md)"
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
    bundle_signing_pub
    if [ -n "${SERVE_PASSWORD:-}" ]; then  # the serving connection's user: [serve] username and password_file
        printf '%s\n' "$SERVE_PASSWORD" > "$OUT/serve.password"
        chmod 0600 "$OUT/serve.password"
        sed -i "s|\"DEVICE.serve\"|\"$SERVE_USER\"|" "$OUT/client.toml"
        echo "==> user $SERVE_USER in $PASSWD, its password in serve.password: uncomment [serve] in client.toml"
    fi
    echo "==> user $NAME in $PASSWD; device bundle in $OUT"
    echo "    copy it to the device, then: sudo deploy/raspberrypi/install.sh --bundle DIR"
fi

if [ "$RELOAD" = 1 ]; then reload_mosquitto ""; fi
