#!/usr/bin/env bash
# The MLflow tracking server of the cluster's head node: PostgreSQL backend store, artifacts proxied to S3 (or a
# shared path), MLflow's basic-auth app. cluster.yaml runs these steps; tests/test_secure_tracking.py runs the same
# commands, rendered from cluster.yaml, against a private PostgreSQL cluster on loopback.
#
#   mlflow_head.sh install            apt-get postgresql (Unix socket only, no TCP port); pip mlflow[auth], psycopg2, boto3
#   mlflow_head.sh init-db OWNER      run as the PostgreSQL superuser: role OWNER (socket login, no password) and
#                                     the databases mlflow (runs, registry) and mlflow_auth (users), idempotent
#   mlflow_head.sh start              (re)start `mlflow server --app-name basic-auth`, wait until it answers, and
#                                     make sure the jobs' user MLFLOW_TRACKING_USERNAME exists with its password
#   mlflow_head.sh stop
#
# Settings (environment):
#   MLFLOW_ARTIFACTS_DESTINATION  required for start: s3://bucket/prefix or a shared directory
#   MLFLOW_HOST                   address to bind; default the node's private IP (workers reach it, the security
#                                 group keeps the outside out). Never 0.0.0.0.
#   MLFLOW_PORT                   default 5000
#   MLFLOW_SERVER_DIR             private state (mode 0700): admin password, Flask secret, auth config, log, pid;
#                                 default ~/.mlflow-server
#   MLFLOW_AUTH_ADMIN_PASSWORD    the admin's password; else read from $MLFLOW_SERVER_DIR/admin-password, which is
#                                 generated (random) on first start when absent. Never in the repository.
#   MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD   the (non-admin) user the jobs log as; from the secret
#                                 file cluster.yaml copies to every node
#   PGHOST / PGPORT               the PostgreSQL socket directory / port (default /var/run/postgresql, 5432)
#   MLFLOW_DB_USER                PostgreSQL role that owns the databases (default: this OS user, peer-authenticated)
#   MLFLOW_SERVER_WORKERS         default 4;  MLFLOW_START_TIMEOUT  seconds to wait for the server, default 180
#   PYTHON                        the interpreter that has mlflow installed (default python3)
set -euo pipefail

PYTHON=${PYTHON:-python3}
export PGHOST=${PGHOST:-/var/run/postgresql} PGPORT=${PGPORT:-5432}

die() { echo "mlflow_head.sh: $*" >&2; exit 1; }

install() {
    sudo apt-get update -q
    sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql
    # No TCP listener at all: MLflow on the same host talks to PostgreSQL over its Unix socket.
    sudo -u postgres psql -q -c "ALTER SYSTEM SET listen_addresses = ''"
    sudo systemctl restart postgresql
    # The auth extra (Flask-WTF) of the mlflow installed with the project, the PostgreSQL driver, S3.
    local mlflow_version; mlflow_version=$("$PYTHON" -c 'import mlflow; print(mlflow.__version__)')
    "$PYTHON" -m pip install -q "mlflow[auth]==$mlflow_version" 'psycopg2-binary>=2.9,<3' 'boto3>=1.28'
}

init_db() {
    local owner=${1:?usage: init-db OWNER}
    # psql variables keep the names quoted; \gexec runs CREATE only when the object is missing (idempotent).
    psql -v ON_ERROR_STOP=1 -q -X -d postgres -v owner="$owner" <<'SQL'
SELECT format('CREATE ROLE %I LOGIN', :'owner') WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'owner')\gexec
SELECT format('CREATE DATABASE %I OWNER %I', d, :'owner') FROM unnest(ARRAY['mlflow', 'mlflow_auth']) AS d
 WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = d)\gexec
SQL
}

# A secret from the environment, else from a 0600 file in the server dir, else generated into that file.
secret() {
    local var=$1 file=$2
    if [[ -n ${!var:-} ]]; then printf '%s' "${!var}"; return; fi
    if [[ ! -s $file ]]; then
        (umask 077 && "$PYTHON" -c 'import secrets; print(secrets.token_urlsafe(24), end="")' > "$file")
    fi
    cat "$file"
}

start() {
    [[ -n ${MLFLOW_ARTIFACTS_DESTINATION:-} ]] || die "set MLFLOW_ARTIFACTS_DESTINATION (s3://bucket/prefix or a shared directory)"
    [[ -n ${MLFLOW_TRACKING_USERNAME:-} && -n ${MLFLOW_TRACKING_PASSWORD:-} ]] \
        || die "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (the jobs' user; see README 'On a cluster')"
    local dir=${MLFLOW_SERVER_DIR:-$HOME/.mlflow-server}
    local host=${MLFLOW_HOST:-$(hostname -I | awk '{print $1}')} port=${MLFLOW_PORT:-5000}
    local db_user=${MLFLOW_DB_USER:-$(id -un)}
    [[ $host != 0.0.0.0 && $host != "::" ]] || die "MLFLOW_HOST must be one address, not $host"
    (umask 077 && mkdir -p "$dir") && chmod 700 "$dir"
    stop
    local admin_password flask_secret
    admin_password=$(secret MLFLOW_AUTH_ADMIN_PASSWORD "$dir/admin-password")
    flask_secret=$(secret MLFLOW_FLASK_SERVER_SECRET_KEY "$dir/flask-secret")
    # The auth app's users live in PostgreSQL too; every authenticated user may read (default_permission), and
    # only owners (the jobs' user for everything the jobs create) and the admin may change things. A password is
    # checked with scrypt (about 0.3 s of CPU) once a minute per credential, not on every request: MLflow's own
    # cache (auth_cache_ttl_seconds; a password changed through the API takes effect at once on the worker that
    # took the change, on the others within the minute).
    (umask 077 && cat > "$dir/basic_auth.ini" <<INI
[mlflow]
default_permission = READ
database_uri = postgresql+psycopg2://$db_user@/mlflow_auth
admin_username = admin
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
auth_cache_ttl_seconds = 60
INI
    )
    # Secrets reach the server through its environment only (not its command line, which `ps` shows to all).
    # MLflow's GenAI server jobs (huey consumers: eight more processes, and job stores in /dev/shm that outlive the
    # server) are off: the pipeline runs none. MLFLOW_SERVER_ENABLE_JOB_EXECUTION=true in the environment turns them on.
    # (No comment line inside the command below: one would end it there, and the server would start without the
    # lines above it, on MLflow's default auth config: users in ./basic_auth.db, no admin password.)
    MLFLOW_AUTH_CONFIG_PATH="$dir/basic_auth.ini" MLFLOW_AUTH_ADMIN_PASSWORD="$admin_password" \
    MLFLOW_FLASK_SERVER_SECRET_KEY="$flask_secret" MLFLOW_TRACKING_USERNAME= MLFLOW_TRACKING_PASSWORD= \
    MLFLOW_SERVER_ENABLE_JOB_EXECUTION="${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}" \
        setsid nohup "$PYTHON" -m mlflow server --app-name basic-auth --host "$host" --port "$port" \
        --workers "${MLFLOW_SERVER_WORKERS:-4}" \
        --backend-store-uri "postgresql+psycopg2://$db_user@/mlflow" \
        --artifacts-destination "$MLFLOW_ARTIFACTS_DESTINATION" --serve-artifacts \
        > "$dir/server.log" 2>&1 < /dev/null &
    echo $! > "$dir/server.pid"
    local url="http://$host:$port" deadline=$((SECONDS + ${MLFLOW_START_TIMEOUT:-180}))
    until "$PYTHON" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/health", timeout=2)' "$url" 2>/dev/null; do
        kill -0 "$(cat "$dir/server.pid")" 2>/dev/null || { tail -n 20 "$dir/server.log" >&2; die "mlflow server exited; log: $dir/server.log"; }
        (( SECONDS < deadline )) || { tail -n 20 "$dir/server.log" >&2; die "mlflow server did not answer at $url"; }
        sleep 1
    done
    # The jobs' user: created once, its password kept equal to the secret's (the admin is never used by jobs).
    JOBS_USER=$MLFLOW_TRACKING_USERNAME JOBS_PASSWORD=$MLFLOW_TRACKING_PASSWORD \
    MLFLOW_TRACKING_USERNAME=admin MLFLOW_TRACKING_PASSWORD=$admin_password "$PYTHON" - "$url" <<'PY'
import os, sys
from mlflow.exceptions import RestException
from mlflow.server.auth.client import AuthServiceClient

client, user, password = AuthServiceClient(sys.argv[1]), os.environ["JOBS_USER"], os.environ["JOBS_PASSWORD"]
try:
    client.get_user(user)
    client.update_user_password(user, password)
except RestException:
    client.create_user(user, password)
print(f"mlflow server at {sys.argv[1]}; jobs log as user {user!r}")
PY
}

stop() {
    local dir=${MLFLOW_SERVER_DIR:-$HOME/.mlflow-server}
    [[ -s $dir/server.pid ]] || return 0
    local pid; pid=$(cat "$dir/server.pid")
    # The server runs in its own session (setsid): its process group is the server and its workers.
    if kill -0 -- "-$pid" 2>/dev/null; then
        kill -- "-$pid"
        for _ in $(seq 30); do kill -0 -- "-$pid" 2>/dev/null || break; sleep 1; done
        kill -9 -- "-$pid" 2>/dev/null || true
    fi
    rm -f "$dir/server.pid"
}

case ${1:-} in
    install) install ;;
    init-db) shift; init_db "$@" ;;
    start) start ;;
    stop) stop ;;
    *) die "usage: mlflow_head.sh install | init-db OWNER | start | stop" ;;
esac
