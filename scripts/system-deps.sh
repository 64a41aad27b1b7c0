#!/bin/sh
# Debian packages the test suite needs that pip cannot install: Mosquitto (the MQTT
# tests start their own broker from this binary). Idempotent; uses sudo when not root.
set -e
need=""
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || need="$need mosquitto"
[ -z "$need" ] && exit 0
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $need >/dev/null
