#!/usr/bin/env bash
# Starts the services the tests and the demo need, when they are not already
# reachable: PostgreSQL on 127.0.0.1:5432 (user postgres, trust auth) and
# Redis on 127.0.0.1:6379. Uses installed binaries, else installs the Debian
# packages. Does nothing when both answer.
set -euo pipefail

PG_PORT=5432
REDIS_PORT=6379
ONLY="${1:-all}" # all | postgres | redis

reachable() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

wait_for() {
	local name=$1 port=$2
	for _ in $(seq 1 60); do
		reachable "$port" && return 0
		sleep 0.5
	done
	echo "services: $name did not come up on 127.0.0.1:$port" >&2
	return 1
}

as_root() {
	if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

apt_install() {
	as_root apt-get update -qq
	as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

start_postgres() {
	if reachable $PG_PORT; then
		echo "services: PostgreSQL is up on 127.0.0.1:$PG_PORT"
		return
	fi
	local fresh=0
	if ! command -v pg_ctlcluster >/dev/null 2>&1 || [ -z "$(ls /etc/postgresql 2>/dev/null)" ]; then
		echo "services: installing PostgreSQL from Debian packages"
		apt_install postgresql
		fresh=1
	fi
	local version
	version=$(ls /etc/postgresql | sort -V | tail -1)
	local hba="/etc/postgresql/$version/main/pg_hba.conf"
	if [ "$fresh" = 1 ] || ! grep -q "omnibus-trust" "$hba" 2>/dev/null; then
		if ! grep -qE '^host\s+all\s+all\s+127\.0\.0\.1/32\s+trust' "$hba"; then
			# Local development and CI only: trust loopback connections.
			as_root sed -i '1i host all all 127.0.0.1/32 trust # omnibus-trust\nhost all all ::1/128 trust # omnibus-trust' "$hba"
		fi
	fi
	echo "services: starting PostgreSQL $version"
	as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start || as_root pg_ctlcluster "$version" main start
	wait_for PostgreSQL $PG_PORT
}

start_redis() {
	if reachable $REDIS_PORT; then
		echo "services: Redis is up on 127.0.0.1:$REDIS_PORT"
		return
	fi
	if ! command -v redis-server >/dev/null 2>&1; then
		echo "services: installing Redis from Debian packages"
		apt_install redis-server
	fi
	echo "services: starting Redis"
	as_root mkdir -p /var/lib/redis /var/log/redis
	as_root redis-server --daemonize yes --bind 127.0.0.1 -::1 --port $REDIS_PORT --save "" --appendonly no \
		--dir /var/lib/redis --logfile /var/log/redis/omnibus.log
	wait_for Redis $REDIS_PORT
}

# Headless Debian chromium drives the console's browser tests (chromedp).
install_chromium() {
	if command -v chromium >/dev/null 2>&1; then
		echo "services: chromium is installed"
		return
	fi
	echo "services: installing chromium from Debian packages"
	apt_install chromium
}

case "$ONLY" in
all) start_postgres; start_redis; install_chromium ;;
postgres) start_postgres ;;
redis) start_redis ;;
chromium) install_chromium ;;
*) echo "usage: $0 [all|postgres|redis|chromium]" >&2; exit 2 ;;
esac
