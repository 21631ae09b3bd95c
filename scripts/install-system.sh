#!/usr/bin/env bash
# Installs the Debian packages promreflex runs for real, only those missing.
# Daemons are never started by the packages' postinst scripts: a policy-rc.d that refuses
# every start is put in place for the install (and removed again if we created it).
set -euo pipefail

declare -A BIN_TO_PKG=(
  [/usr/bin/prometheus]=prometheus
  [/usr/bin/promtool]=prometheus
  [/usr/bin/prometheus-alertmanager]=prometheus-alertmanager
  [/usr/bin/amtool]=prometheus-alertmanager
  [/usr/bin/prometheus-node-exporter]=prometheus-node-exporter
  [/usr/bin/prometheus-nginx-exporter]=prometheus-nginx-exporter
  [/usr/sbin/nginx]=nginx
)

missing=()
for bin in "${!BIN_TO_PKG[@]}"; do
  [ -x "$bin" ] || missing+=("${BIN_TO_PKG[$bin]}")
done
[ ${#missing[@]} -eq 0 ] && exit 0
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-system: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi

echo "install-system: installing ${missing[*]}"
guard=/usr/sbin/policy-rc.d
created_guard=0
if [ ! -e "$guard" ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$guard" >/dev/null
  $SUDO chmod +x "$guard"
  created_guard=1
fi
cleanup() { [ "$created_guard" -eq 1 ] && $SUDO rm -f "$guard"; }
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"

# Some postinst scripts start a daemon even so (or a previous install did): stop any system
# instance that holds the default ports, so the local stack can use them.
for svc in prometheus prometheus-alertmanager prometheus-node-exporter prometheus-nginx-exporter nginx; do
  if command -v service >/dev/null && service "$svc" status >/dev/null 2>&1; then
    $SUDO service "$svc" stop >/dev/null 2>&1 || true
  fi
done
