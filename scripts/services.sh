#!/usr/bin/env bash
# Starts the services the tests and the demo need, when they are not already
# reachable: PostgreSQL on 127.0.0.1:5432 (user postgres, trust auth), Redis
# on 127.0.0.1:6379 and a 3-node Redis Cluster on 127.0.0.1:7001-7003 (no
# replicas, no persistence), RabbitMQ on 127.0.0.1:5672 (guest/guest) and
# NATS with JetStream on 127.0.0.1:4222. Uses installed binaries, else installs the
# Debian packages. Does nothing for a service that already answers (the
# cluster: CLUSTER INFO reports cluster_state:ok).
set -euo pipefail

PG_PORT=5432
REDIS_PORT=6379
CLUSTER_PORTS=(7001 7002 7003)
CLUSTER_DIR="${OMNIBUS_TEST_REDIS_CLUSTER_DIR:-/var/lib/omnibus-redis-cluster}"
ONLY="${1:-all}" # all | postgres | redis | redis-cluster | rabbitmq | nats | chromium

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
	ensure_redis_binaries
	echo "services: starting Redis"
	as_root mkdir -p /var/lib/redis /var/log/redis
	as_root redis-server --daemonize yes --bind 127.0.0.1 -::1 --port $REDIS_PORT --save "" --appendonly no \
		--dir /var/lib/redis --logfile /var/log/redis/omnibus.log
	wait_for Redis $REDIS_PORT
}

ensure_redis_binaries() {
	if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
		echo "services: installing Redis from Debian packages"
		apt_install redis-server redis-tools
	fi
}

cluster_ok() {
	command -v redis-cli >/dev/null 2>&1 || return 1
	local port
	for port in "${CLUSTER_PORTS[@]}"; do
		redis-cli -h 127.0.0.1 -p "$port" cluster info 2>/dev/null | grep -q '^cluster_state:ok' || return 1
	done
}

start_redis_cluster() {
	local ports="${CLUSTER_PORTS[*]}"
	if cluster_ok; then
		echo "services: Redis Cluster is up on 127.0.0.1:${ports// /,}"
		return
	fi
	ensure_redis_binaries
	local port nodes=()
	for port in "${CLUSTER_PORTS[@]}"; do
		nodes+=("127.0.0.1:$port")
		if reachable "$port"; then
			continue
		fi
		# A node that is not running starts afresh: its old cluster config
		# names a cluster that no longer exists.
		as_root mkdir -p "$CLUSTER_DIR/$port"
		as_root rm -f "$CLUSTER_DIR/$port/nodes.conf"
		echo "services: starting Redis Cluster node on 127.0.0.1:$port"
		as_root redis-server --daemonize yes --bind 127.0.0.1 --port "$port" \
			--cluster-enabled yes --cluster-config-file "$CLUSTER_DIR/$port/nodes.conf" \
			--cluster-node-timeout 5000 --save "" --appendonly no \
			--dir "$CLUSTER_DIR/$port" --logfile "$CLUSTER_DIR/$port/redis.log"
		wait_for "Redis Cluster node" "$port"
	done
	# Nodes that already know each other (a cluster still converging) need
	# no create; empty nodes do.
	local known
	known=$(redis-cli -h 127.0.0.1 -p "${CLUSTER_PORTS[0]}" cluster info | sed -n 's/^cluster_known_nodes:\([0-9]*\).*/\1/p')
	if [ "${known:-1}" -lt "${#CLUSTER_PORTS[@]}" ]; then
		echo "services: creating the Redis Cluster over ${nodes[*]}"
		redis-cli --cluster create "${nodes[@]}" --cluster-replicas 0 --cluster-yes >/dev/null
	fi
	for _ in $(seq 1 60); do
		cluster_ok && { echo "services: Redis Cluster is up on 127.0.0.1:${ports// /,}"; return 0; }
		sleep 0.5
	done
	echo "services: Redis Cluster on ${nodes[*]} did not reach cluster_state:ok;" \
		"stop those nodes and delete $CLUSTER_DIR to start afresh" >&2
	return 1
}

RABBITMQ_PORT=5672
NATS_PORT=4222

# RabbitMQ from Debian's rabbitmq-server (guest/guest on loopback).
start_rabbitmq() {
	if reachable $RABBITMQ_PORT; then
		echo "services: RabbitMQ is up on 127.0.0.1:$RABBITMQ_PORT"
		return
	fi
	if ! command -v rabbitmq-server >/dev/null 2>&1; then
		echo "services: installing RabbitMQ from Debian packages"
		apt_install rabbitmq-server
	fi
	echo "services: starting RabbitMQ"
	if command -v service >/dev/null 2>&1 && [ -x /etc/init.d/rabbitmq-server ]; then
		as_root service rabbitmq-server start >/dev/null 2>&1 || true
	fi
	reachable $RABBITMQ_PORT || as_root env RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 rabbitmq-server -detached >/dev/null 2>&1 || true
	for _ in $(seq 1 120); do
		reachable $RABBITMQ_PORT && { echo "services: RabbitMQ is up on 127.0.0.1:$RABBITMQ_PORT"; return 0; }
		sleep 0.5
	done
	echo "services: RabbitMQ did not come up on 127.0.0.1:$RABBITMQ_PORT" >&2
	return 1
}

# NATS with JetStream from Debian's nats-server.
start_nats() {
	if reachable $NATS_PORT; then
		echo "services: NATS is up on 127.0.0.1:$NATS_PORT"
		return
	fi
	if ! command -v nats-server >/dev/null 2>&1; then
		echo "services: installing NATS from Debian packages"
		apt_install nats-server
	fi
	echo "services: starting NATS with JetStream"
	as_root mkdir -p /var/lib/nats-server
	as_root sh -c "nohup nats-server -a 127.0.0.1 -p $NATS_PORT -js -sd /var/lib/nats-server -l /var/log/nats-server.log >/dev/null 2>&1 &"
	wait_for NATS $NATS_PORT
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
all) start_postgres; start_redis; start_redis_cluster; start_rabbitmq; start_nats; install_chromium ;;
postgres) start_postgres ;;
redis) start_redis ;;
redis-cluster) start_redis_cluster ;;
rabbitmq) start_rabbitmq ;;
nats) start_nats ;;
chromium) install_chromium ;;
*) echo "usage: $0 [all|postgres|redis|redis-cluster|rabbitmq|nats|chromium]" >&2; exit 2 ;;
esac
