#!/usr/bin/env bash
# `make run`: start a sluice-controller (REST https://127.0.0.1:9090 with a
# bearer token, stream 127.0.0.1:18000, data in ./sluice-data), a
# sluice-runtime connected to it (proxy :8080, admin 127.0.0.1:9901) and the
# demo backend (127.0.0.1:9001); apply examples/quickstart.yaml through the
# REST API; print what to try, with curl and with kubectl. The token is
# ./sluice-data/admin-token (made once, kept); with it the controller serves
# HTTPS with a CA it generates in ./sluice-data and writes
# ./sluice-data/kubeconfig (docs/security.md). Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
CTL="$BUILD/bin/sluice-controller"
RT="$BUILD/bin/sluice-runtime"
for b in "$CTL" "$RT"; do
  [ -x "$b" ] || { echo "run: $b is missing; run 'make' first" >&2; exit 1; }
done
for port in 8080 9001 9090 9901 18000; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "run: port $port is already in use (is a previous 'make run' still running?)" >&2
    exit 1
  fi
done

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

DATA=./sluice-data
TOKEN_FILE=$DATA/admin-token
mkdir -p "$DATA"
chmod 700 "$DATA"
if [ ! -s "$TOKEN_FILE" ]; then
  (umask 077 && head -c 32 /dev/urandom | base64 | tr -d '/+=\n' >"$TOKEN_FILE")
fi
TOKEN=$(cat "$TOKEN_FILE")
CA=$DATA/rest-ca.crt
KUBECONFIG_FILE=$PWD/sluice-data/kubeconfig
# The REST API over HTTPS with the token, trusting the generated CA.
rest() { curl -fsS --cacert "$CA" -H "Authorization: Bearer $TOKEN" "$@"; }

/usr/bin/python3 examples/demo_backend.py 9001 2>/tmp/sluice-demo-backend.log &
pids+=($!)
"$CTL" --data-dir "$DATA" --rest 127.0.0.1:9090 --stream 127.0.0.1:18000 \
       --admin-token-file "$TOKEN_FILE" &
pids+=($!)
"$RT" --controller 127.0.0.1:18000 --node-id demo-runtime --fleet default \
      --admin 127.0.0.1:9901 --access-log stdout &
pids+=($!)

for _ in $(seq 1 100); do
  [ -s "$KUBECONFIG_FILE" ] && rest -o /dev/null https://127.0.0.1:9090/healthz 2>/dev/null && break
  sleep 0.1
done
rest -X PUT -H 'Content-Type: application/yaml' --data-binary @examples/quickstart.yaml \
     https://127.0.0.1:9090/api/v1/resources -o /dev/null \
  || { echo "run: applying examples/quickstart.yaml failed" >&2; exit 1; }
for _ in $(seq 1 50); do
  curl -fsS -o /dev/null http://127.0.0.1:9901/ready 2>/dev/null && break
  sleep 0.1
done
curl -fsS -o /dev/null http://127.0.0.1:9901/ready || { echo "run: runtime did not become ready" >&2; exit 1; }

cat <<'MSG'

Sluice is running:
  controller  REST https://127.0.0.1:9090 (token in ./sluice-data/admin-token, CA
              ./sluice-data/rest-ca.crt)   config stream 127.0.0.1:18000   data ./sluice-data
  runtime     http://127.0.0.1:8080        admin http://127.0.0.1:9901
  backend     127.0.0.1:9001 (demo pet store)
examples/quickstart.yaml was applied through the REST API. Try:

  curl -i http://127.0.0.1:8080/petstore/v1/pets
  curl -i http://127.0.0.1:8080/petstore/v1/pets/7
  curl -i -X POST -H 'Content-Type: application/json' -d '{"name":"Kitty"}' http://127.0.0.1:8080/petstore/v1/pets
  curl -i http://127.0.0.1:8080/nowhere                      # 404, JSON error
  curl -i -X DELETE http://127.0.0.1:8080/petstore/v1/pets   # 405 with Allow

The REST API wants the token, over HTTPS; in your shell:
  export SLUICE_CA=./sluice-data/rest-ca.crt SLUICE_TOKEN=$(cat ./sluice-data/admin-token)

Change the config live (no restart, no dropped connection) — add an operation:
  curl -s --cacert $SLUICE_CA -H "Authorization: Bearer $SLUICE_TOKEN" -X PUT \
    -H 'Content-Type: application/yaml' https://127.0.0.1:9090/api/v1/apis/petstore --data-binary '
apiVersion: gateway.sluice.dev/v1alpha1
kind: Api
metadata: {name: petstore}
spec:
  basePath: /petstore/v1
  backendRefs: [{name: echo}]
  operations:
  - {method: GET, path: /pets}
  - {method: GET, path: "/pets/{id}"}
  - {method: POST, path: /pets}
  - {method: DELETE, path: "/pets/{id}"}'
  curl -i -X DELETE http://127.0.0.1:8080/petstore/v1/pets/7   # now routed

See it:
  curl -s --cacert $SLUICE_CA -H "Authorization: Bearer $SLUICE_TOKEN" \
    https://127.0.0.1:9090/api/v1/runtimes           # runtimes, acked versions, NACKs
  curl -s --cacert $SLUICE_CA -H "Authorization: Bearer $SLUICE_TOKEN" \
    https://127.0.0.1:9090/api/v1/status
  curl -s http://127.0.0.1:9901/config_dump
  curl -s http://127.0.0.1:9901/metrics | grep sluice_requests_total
MSG
cat <<MSG

kubectl against the controller (the kubeconfig carries the CA and the token):
  export KUBECONFIG=$KUBECONFIG_FILE
  kubectl get apis
  kubectl get --raw /api/v1/status

Ctrl-C stops everything. Access log lines follow.
MSG
wait
