#!/usr/bin/env bash
# Installs the Debian packages promreflex runs for real, only those missing.
# Daemons are never started by the packages' postinst scripts: a policy-rc.d that refuses
# every start is put in place for the install (and removed again if we created it).
#
# Usage: scripts/install-system.sh [PROFILE...]   (default: base)
#   base    Prometheus, Alertmanager, node_exporter, nginx and its exporter: `make demo`; curl
#           (the demo's hints use it)
#   swift   OpenStack Swift (proxy, account, container, object), memcached, tcpdump, iproute2:
#           the Swift lab (`promreflex swift-lab`, network namespaces), the fleet, their tests
#   shop    php-fpm, MariaDB and WordPress: the real PHP shop of the copy-guard bench and its test
#   tshark  the decoder the Swift capture exporter is checked (a unit test compares the decoded
#           fields) and benchmarked against
# `make test` asks for all four (the integration tests run those binaries).
#
# Also python3-venv when uv is not on PATH: scripts/uv then installs uv from PyPI into a
# virtual environment (Debian's python3 refuses `pip install` outside one, PEP 668).
#
# For tests (tests/unit/test_install_system.py), never needed otherwise:
#   PROMREFLEX_BIN_ROOT   prefix of the checked binaries' paths (default: none, i.e. /usr/...)
#   PROMREFLEX_POLICY_RC  the policy-rc.d guard's path (default /usr/sbin/policy-rc.d)
#   PROMREFLEX_SYSTEMD_DIR  where units are enabled (default /etc/systemd/system)
set -euo pipefail

root=${PROMREFLEX_BIN_ROOT:-}
# One map per profile: a file the package installs -> the package.
declare -A PROFILE_base=(
  [/usr/bin/prometheus]=prometheus
  [/usr/bin/promtool]=prometheus
  [/usr/bin/prometheus-alertmanager]=prometheus-alertmanager
  [/usr/bin/amtool]=prometheus-alertmanager
  [/usr/bin/prometheus-node-exporter]=prometheus-node-exporter
  [/usr/bin/prometheus-nginx-exporter]=prometheus-nginx-exporter
  [/usr/sbin/nginx]=nginx
  [/usr/bin/curl]=curl
)
declare -A PROFILE_swift=(
  [/usr/bin/swift-ring-builder]=swift
  [/usr/bin/swift-proxy-server]=swift-proxy
  [/usr/bin/swift-account-server]=swift-account
  [/usr/bin/swift-container-server]=swift-container
  [/usr/bin/swift-object-server]=swift-object
  [/usr/bin/memcached]=memcached
  [/usr/bin/tcpdump]=tcpdump
  [/usr/bin/ip]=iproute2
)
declare -A PROFILE_shop=(
  [/usr/sbin/php-fpm8.2]=php8.2-fpm
  [/usr/bin/php8.2]=php8.2-cli
  [/usr/share/php8.2-mysql/mysql/mysqli.ini]=php8.2-mysql
  [/usr/sbin/mariadbd]=mariadb-server
  [/usr/bin/mariadb-install-db]=mariadb-server
  [/usr/share/wordpress/wp-settings.php]=wordpress
)
declare -A PROFILE_tshark=(
  [/usr/bin/tshark]=tshark
)

profiles=("$@")
[ ${#profiles[@]} -eq 0 ] && profiles=(base)
missing=()
for profile in "${profiles[@]}"; do
  case "$profile" in
    base|swift|shop|tshark) ;;
    *) echo "install-system: unknown profile '$profile' (known: base swift shop tshark)" >&2; exit 2 ;;
  esac
  declare -n map="PROFILE_$profile"
  for bin in "${!map[@]}"; do
    [ -e "$root$bin" ] || missing+=("${map[$bin]}")
  done
  unset -n map
done
if ! command -v uv >/dev/null 2>&1 && ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
  missing+=(python3-venv)
fi
[ ${#missing[@]} -eq 0 ] && exit 0
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-system: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi

echo "install-system: installing ${missing[*]}"
guard=${PROMREFLEX_POLICY_RC:-/usr/sbin/policy-rc.d}
created_guard=0
if [ ! -e "$guard" ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$guard" >/dev/null
  $SUDO chmod +x "$guard"
  created_guard=1
fi
# An `if`, not `[ ... ] && ...`: under set -e a false test as the trap's last command would
# make the whole script exit 1 after a successful install (when the guard was already there).
cleanup() { if [ "$created_guard" -eq 1 ]; then $SUDO rm -f "$guard"; fi; }
trap cleanup EXIT

# The units enabled at boot (their `*.wants/` links), before and after the install.
systemd_dir=${PROMREFLEX_SYSTEMD_DIR:-/etc/systemd/system}
enabled_links() { if [ -d "$systemd_dir" ]; then find "$systemd_dir" -path '*.wants/*' -type l | sort; fi; }
enabled_before=$(enabled_links)

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"

# The guard keeps the daemons from starting now, but the packages' postinst scripts still enable
# them at boot: after a reboot Prometheus, Alertmanager, node_exporter, nginx... would hold the
# ports the local stack starts its own on (`make demo`: "port(s) already in use"). The daemons
# promreflex runs itself that this install enabled are disabled again, as `systemctl disable`
# does (their links removed: a later upgrade of the package keeps them disabled); what was
# enabled before, and what the install enabled for anything else (rsyslog, logrotate.timer, a
# dependency's own service), is left as it was.
mapfile -t new_links < <(comm -13 <(printf '%s\n' "$enabled_before") <(enabled_links))
disabled=()
for link in "${new_links[@]}"; do
  [ -n "$link" ] || continue
  case "$(basename "$link")" in
    prometheus.service|prometheus-alertmanager.service|prometheus-node-exporter.service) ;;
    prometheus-nginx-exporter.service|nginx.service|memcached.service|mariadb.service) ;;
    php8.2-fpm.service|swift-*.service) ;;
    *) continue ;;
  esac
  $SUDO rm -f "$link"
  disabled+=("$(basename "$link")")
done
if [ ${#disabled[@]} -gt 0 ]; then
  mapfile -t disabled < <(printf '%s\n' "${disabled[@]}" | sort -u)
  echo "install-system: not started at boot (promreflex starts its own): ${disabled[*]}"
fi

# Some postinst scripts start a daemon even so (or a previous install did): stop any system
# instance that holds the default ports, so the local stack can use them.
for svc in prometheus prometheus-alertmanager prometheus-node-exporter prometheus-nginx-exporter nginx memcached mariadb php8.2-fpm; do
  if command -v service >/dev/null && service "$svc" status >/dev/null 2>&1; then
    $SUDO service "$svc" stop >/dev/null 2>&1 || true
  fi
done
