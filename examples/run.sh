#!/usr/bin/env bash
# `make run`: start the demo backend (127.0.0.1:9001) and a sluice-runtime
# serving examples/quickstart.yaml on :8080 (admin on 127.0.0.1:9901), print
# what to try, and stop both on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
BIN="$BUILD/bin/sluice-runtime"
[ -x "$BIN" ] || { echo "run: $BIN is missing; run 'make' first" >&2; exit 1; }

for port in 8080 9001 9901; do
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

/usr/bin/python3 examples/demo_backend.py 9001 2>/tmp/sluice-demo-backend.log &
pids+=($!)
"$BIN" --config examples/quickstart.yaml --admin 127.0.0.1:9901 --access-log stdout &
pids+=($!)

for _ in $(seq 1 50); do
  curl -fsS -o /dev/null http://127.0.0.1:9901/ready 2>/dev/null && break
  sleep 0.1
done
curl -fsS -o /dev/null http://127.0.0.1:9901/ready || { echo "run: runtime did not become ready" >&2; exit 1; }

cat <<'MSG'

Sluice is running: runtime on http://127.0.0.1:8080, admin on http://127.0.0.1:9901,
demo backend on 127.0.0.1:9001, config examples/quickstart.yaml. Try:

  curl -i http://127.0.0.1:8080/petstore/v1/pets
  curl -i http://127.0.0.1:8080/petstore/v1/pets/7
  curl -i -X POST -H 'Content-Type: application/json' -d '{"name":"Kitty"}' http://127.0.0.1:8080/petstore/v1/pets
  curl -i http://127.0.0.1:8080/nowhere              # 404, JSON error
  curl -i -X DELETE http://127.0.0.1:8080/petstore/v1/pets   # 405 with Allow
  curl -s http://127.0.0.1:9901/metrics | grep sluice_requests_total
  curl -s http://127.0.0.1:9901/config_dump

Edit examples/quickstart.yaml and reload without dropping a connection:
  kill -HUP $(pgrep -f 'sluice-runtime --config examples/quickstart.yaml')

Ctrl-C stops everything. Access log lines follow.
MSG
wait
