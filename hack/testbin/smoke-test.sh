#!/usr/bin/env bash
# Smoke test for the binaries built by hack/build-testbin: start etcd and
# kube-apiserver on loopback (random free ports, temp dirs), wait for /readyz,
# run `kubectl get ns`, then stop everything.
#
# Usage:  hack/testbin/smoke-test.sh [BIN_DIR]
#         (BIN_DIR defaults to the output of hack/build-testbin)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN=${1:-$("$here/../build-testbin" | tail -1)}

log() { printf 'smoke-test: %s\n' "$*" >&2; }
now() { date +%s.%N; }

work=$(mktemp -d "${TMPDIR:-/tmp}/gpushare-testbin-smoke.XXXXXX")
pids=()
# Stop in reverse start order: kube-apiserver must go before etcd, or its
# graceful shutdown keeps retrying the vanished etcd and never finishes.
stop() {
  local p=$1 i
  kill "$p" 2>/dev/null || return 0
  for ((i = 0; i < 100; i++)); do
    kill -0 "$p" 2>/dev/null || break
    sleep 0.1
  done
  kill -9 "$p" 2>/dev/null || true
  wait "$p" 2>/dev/null || true
}
cleanup() {
  local i
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do stop "${pids[i]}"; done
  rm -rf "$work"
}
trap cleanup EXIT

# Three free loopback ports: etcd client, etcd peer, apiserver.
read -r etcd_port peer_port api_port < <(python3 - <<'EOF'
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
EOF
)

token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
printf '%s,admin,admin-uid,"system:masters"\n' "$token" > "$work/tokens.csv"
openssl genrsa -out "$work/sa.key" 2048 2>/dev/null

log "etcd on 127.0.0.1:$etcd_port"
"$BIN/etcd" \
  --name=default \
  --data-dir="$work/etcd" \
  --listen-client-urls="http://127.0.0.1:$etcd_port" \
  --advertise-client-urls="http://127.0.0.1:$etcd_port" \
  --listen-peer-urls="http://127.0.0.1:$peer_port" \
  --initial-advertise-peer-urls="http://127.0.0.1:$peer_port" \
  --initial-cluster="default=http://127.0.0.1:$peer_port" \
  --unsafe-no-fsync \
  --log-level=warn \
  >"$work/etcd.log" 2>&1 &
pids+=($!)

log "kube-apiserver on 127.0.0.1:$api_port"
t0=$(now)
"$BIN/kube-apiserver" \
  --bind-address=127.0.0.1 \
  --advertise-address=127.0.0.1 \
  --secure-port="$api_port" \
  --etcd-servers="http://127.0.0.1:$etcd_port" \
  --service-cluster-ip-range=10.0.0.0/24 \
  --endpoint-reconciler-type=none \
  --authorization-mode=RBAC \
  --token-auth-file="$work/tokens.csv" \
  --service-account-issuer=https://kubernetes.default.svc \
  --service-account-key-file="$work/sa.key" \
  --service-account-signing-key-file="$work/sa.key" \
  --cert-dir="$work/certs" \
  >"$work/apiserver.log" 2>&1 &
api_pid=$!
pids+=("$api_pid")

deadline=$((SECONDS + 120))
until curl -fsk -H "Authorization: Bearer $token" "https://127.0.0.1:$api_port/readyz" >/dev/null 2>&1; do
  if ! kill -0 "$api_pid" 2>/dev/null || (( SECONDS > deadline )); then
    log "kube-apiserver did not become ready; last log lines:"
    tail -30 "$work/apiserver.log" >&2
    exit 1
  fi
  sleep 0.2
done
t1=$(now)
log "/readyz ok after $(python3 -c "print(f'{$t1 - $t0:.1f}')")s"

"$BIN/kubectl" --server="https://127.0.0.1:$api_port" --token="$token" \
  --insecure-skip-tls-verify get ns
"$BIN/kubectl" --server="https://127.0.0.1:$api_port" --token="$token" \
  --insecure-skip-tls-verify version
log "ok"
