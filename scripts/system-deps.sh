#!/bin/sh
# Debian packages that pip cannot install and the documented commands need:
#   Mosquitto  - the MQTT broker (dqcep run --input mqtt://..., the MQTT tests start their own);
#   Java 17    - the JVM of Spark (dqcep spark ...);
#   Graphviz   - dot, to draw `dqcep explain --dot` (docs/cli.md);
#   PostgreSQL - the server of --output postgresql://... (the tests start their own with
#                initdb + pg_ctl; the Debian package starts no server of its own here);
#   Chromium and chromedriver - the browser the service's live page is tested in (selenium).
# Idempotent: installs only what is missing; uses sudo when not root.
set -e
need=""
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || need="$need mosquitto"
if ! { [ -n "$JAVA_HOME" ] && [ -x "$JAVA_HOME/bin/java" ]; } && ! command -v java >/dev/null 2>&1; then
    need="$need openjdk-17-jre-headless"
fi
command -v dot >/dev/null 2>&1 || need="$need graphviz"
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need="$need postgresql"
command -v chromium >/dev/null 2>&1 || need="$need chromium"
command -v chromedriver >/dev/null 2>&1 || need="$need chromium-driver"
[ -z "$need" ] && exit 0
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $need >/dev/null
