#!/usr/bin/env bash
# Starts (and, on a machine without them, installs) the servers the tests
# talk to: PostgreSQL on 127.0.0.1:5432, MariaDB on 127.0.0.1:3306 and
# RabbitMQ on 127.0.0.1:5672. Servers that already answer are left alone.
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

if [ $# -eq 0 ]; then set -- postgres mariadb rabbitmq; fi
for s in "$@"; do "$s"; done
