#!/usr/bin/python3
"""Demo backend for `make run`: a tiny pet store that echoes what it received,
so a person can see what the gateway forwarded (path after the base path was
stripped, X-Forwarded-* and X-Request-Id headers). Not a test fixture: the
integration tests use tests/integration/backend.py."""
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PETS = {"1": {"id": 1, "name": "Rex", "kind": "dog"},
        "7": {"id": 7, "name": "Tom", "kind": "cat"}}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _send(self, status, obj):
        body = (json.dumps(obj, indent=2) + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _echo(self):
        return {"method": self.command, "path": self.path,
                "headers": {k: v for k, v in self.headers.items()}}

    def do_GET(self):
        if self.path == "/pets":
            self._send(200, {"pets": list(PETS.values()), "seen_by_backend": self._echo()})
        elif self.path.startswith("/pets/"):
            pet = PETS.get(self.path[len("/pets/"):])
            self._send(200 if pet else 404,
                       {"pet": pet, "seen_by_backend": self._echo()})
        else:
            self._send(200, {"seen_by_backend": self._echo()})

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        try:
            pet = json.loads(body or b"{}")
        except ValueError:
            self._send(400, {"error": "body must be JSON"})
            return
        self._send(201, {"created": pet, "seen_by_backend": self._echo()})

    def do_DELETE(self):
        pet = PETS.get(self.path[len("/pets/"):]) if self.path.startswith("/pets/") else None
        self._send(200 if pet else 404, {"deleted": pet, "seen_by_backend": self._echo()})

    def log_message(self, fmt, *args):
        sys.stderr.write("demo-backend: " + (fmt % args) + "\n")


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 9001
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
