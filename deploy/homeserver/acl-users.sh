# shellcheck shell=bash
# Shared by add-device.sh and remove-device.sh (sourced, not run): who a user of the broker's ACL
# is, and reloading mosquitto after a change.

# user_role ACL NAME: the role of the ACL's `user NAME` block: coordinator (it reads every uplink),
# homeassistant (it writes the command topic) or device
user_role() {
    awk -v u="user $2" '$0 == u { on = 1; next } /^user / { on = 0 }
        on && $0 == "topic read edgefl/+/up/+" { role = "coordinator" }
        on && $0 == "topic write edgefl/+/ha/command" { role = "homeassistant" }
        END { print (role ? role : "device") }' "$1"
}

# reload_mosquitto NOTE: users and the ACL read again (SIGHUP), or how to do it; NOTE follows the message
reload_mosquitto() {
    if command -v systemctl >/dev/null && systemctl is-active --quiet mosquitto 2>/dev/null; then
        systemctl reload mosquitto
        echo "==> reloaded mosquitto$1"
    else
        echo "==> reload mosquitto to apply (systemctl reload mosquitto)"
    fi
}
