#!/usr/bin/env bash
# Starts (and, on a machine without them, installs) the servers the tests
# talk to: PostgreSQL on 127.0.0.1:5432, MariaDB on 127.0.0.1:3306, RabbitMQ
# on 127.0.0.1:5672, NATS with JetStream on 127.0.0.1:4222, Redis on
# 127.0.0.1:6379, Mosquitto (MQTT 5) on 127.0.0.1:1883 and moto's SQS API
# server on 127.0.0.1:5000; and installs the binaries tests start servers of their own
# from (nats-server for a JetStream cluster, redis-server, pgbouncer).
# Servers that already answer are left alone. Named arguments run only the
# named steps: `services.sh galera patroni` installs the binaries the
# cluster lanes of .ci/run start clusters of their own from, and touches no
# running server.
set -euo pipefail

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
wait_for() { # port name seconds
  for _ in $(seq "$3"); do listening "$1" && return 0; sleep 1; done
  echo "services: $2 did not start listening on 127.0.0.1:$1" >&2; return 1
}
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
apt_updated=
apt_install() {
  [ -n "$apt_updated" ] || { as_root apt-get update -qq; apt_updated=1; }
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

postgres() {
  listening 5432 && return 0
  if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
    echo "services: installing PostgreSQL"; apt_install postgresql
  fi
  local v; v=$(ls /etc/postgresql | sort -V | tail -1)
  # Trust local TCP connections for the test databases, as this project's machines do.
  local hba="/etc/postgresql/$v/main/pg_hba.conf"
  if ! grep -q '^host all all 127.0.0.1/32 trust' "$hba"; then
    as_root sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust\nlocal all all trust' "$hba"
  fi
  as_root pg_ctlcluster --skip-systemctl-redirect "$v" main start || true
  wait_for 5432 PostgreSQL 60
  for db in test root; do
    psql -h 127.0.0.1 -U postgres -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$db'" | grep -q 1 ||
      psql -h 127.0.0.1 -U postgres -d postgres -qc "CREATE DATABASE $db"
  done
}

mariadb() {
  listening 3306 && return 0
  if [ ! -x /usr/sbin/mariadbd ]; then echo "services: installing MariaDB"; apt_install mariadb-server; fi
  as_root mkdir -p /run/mysqld && as_root chown mysql:mysql /run/mysqld 2>/dev/null || true
  as_root start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql --bind-address=127.0.0.1
  wait_for 3306 MariaDB 60
  # root with an empty password over TCP, and the test database.
  as_root mariadb -e "CREATE DATABASE IF NOT EXISTS test; ALTER USER 'root'@'localhost' IDENTIFIED VIA mysql_native_password USING PASSWORD(''); FLUSH PRIVILEGES;" 2>/dev/null || true
}

rabbitmq() {
  listening 5672 && return 0
  if ! command -v rabbitmq-server >/dev/null; then echo "services: installing RabbitMQ"; apt_install rabbitmq-server; fi
  as_root rabbitmq-server -detached || true
  wait_for 5672 RabbitMQ 120
}

nats() {
  type -P nats-server >/dev/null || [ -x /usr/sbin/nats-server ] || { echo "services: installing nats-server"; apt_install nats-server; }
  listening 4222 && return 0
  as_root mkdir -p /var/lib/nats-server
  as_root start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
    -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
  wait_for 4222 NATS 60
}

redis() {
  type -P redis-server >/dev/null || { echo "services: installing Redis"; apt_install redis-server; }
  listening 6379 && return 0
  as_root mkdir -p /var/lib/redis /var/log/redis
  as_root redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  wait_for 6379 Redis 60
}

mosquitto() {
  type -P mosquitto >/dev/null || [ -x /usr/sbin/mosquitto ] || { echo "services: installing Mosquitto"; apt_install mosquitto; }
  listening 1883 && return 0
  # A configuration of the tests' own: loopback only, anonymous, persistent
  # sessions kept on disk.
  local dir=/var/lib/mosquitto-idempotent
  as_root mkdir -p "$dir"
  as_root chown mosquitto: "$dir" 2>/dev/null || true
  printf '%s\n' 'listener 1883 127.0.0.1' 'allow_anonymous true' 'persistence true' \
    "persistence_location $dir/" "log_dest file $dir/mosquitto.log" | as_root tee "$dir/mosquitto.conf" >/dev/null
  as_root "$(type -P mosquitto || echo /usr/sbin/mosquitto)" -d -c "$dir/mosquitto.conf"
  wait_for 1883 Mosquitto 30
}

# moto's server speaks the SQS API (and the rest of AWS's) on 127.0.0.1:5000,
# keeping its queues in memory.
moto() {
  if ! type -P moto_server >/dev/null; then
    echo "services: installing moto"; python3 -m pip install -q 'moto[server]'
  fi
  listening 5000 && return 0
  (setsid nohup moto_server -H 127.0.0.1 -p 5000 >/tmp/moto_server.log 2>&1 &)
  wait_for 5000 moto 60
}

pgbouncer() {
  type -P pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || { echo "services: installing PgBouncer"; apt_install pgbouncer; }
}

# The Galera provider (and rsync, its state transfer) beside MariaDB, for
# tests/internal/galera's three-node clusters.
galera() {
  [ -e /usr/lib/galera/libgalera_smm.so ] && type -P rsync >/dev/null && return 0
  echo "services: installing galera-4"; apt_install --no-install-recommends galera-4 rsync
}

# Patroni and etcd, for tests/internal/patroni's clusters. Where systemd
# runs, installing etcd-server starts and enables its service: it is
# stopped and disabled again, the tests run an etcd of their own.
patroni() {
  type -P patroni >/dev/null && type -P etcd >/dev/null && return 0
  echo "services: installing Patroni and etcd"
  apt_install --no-install-recommends patroni etcd-server python3-etcd python3-psycopg2
  if [ -d /run/systemd/system ]; then as_root systemctl disable --now etcd >/dev/null 2>&1 || true; fi
}

if [ $# -eq 0 ]; then set -- postgres mariadb rabbitmq nats redis mosquitto moto pgbouncer; fi
for s in "$@"; do "$s"; done
