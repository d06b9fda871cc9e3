# Copyright Larder authors. Licensed under the Apache License, Version 2.0.
"""The client's own HTTP server (setup(enable_client_http_server=True)): /health, /metrics,
/metrics/summary and /version, as Mooncake's client serves them, with Larder's transfer
counters by route."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import larder

_ROUTES = ("local", "shm", "tcp", "device")


def metrics_text(store: larder.Store) -> str:
    """Prometheus text of the client's transfer counters (by route and direction)."""
    stats = json.loads(store.stats_json())
    lines = [
        "# HELP larder_client_route_bytes_total Bytes this client moved, by route.",
        "# TYPE larder_client_route_bytes_total counter",
    ]
    totals: dict[tuple[str, str], dict[str, int]] = {}
    for peer in stats.get("peers", []):
        for direction in ("reads", "writes"):
            counters = peer.get(direction, {})
            entry = totals.setdefault((peer.get("route", "none"), direction),
                                      {"bytes": 0, "requests": 0, "failures": 0})
            for field in entry:
                entry[field] += int(counters.get(field, 0))
    for name, field in (("bytes", "bytes"), ("requests", "requests"),
                        ("failures", "failures")):
        if name != "bytes":
            lines.append(f"# TYPE larder_client_route_{name}_total counter")
        for (route, direction), entry in sorted(totals.items()):
            lines.append(f'larder_client_route_{name}_total{{route="{route}",'
                         f'direction="{direction[:-1]}"}} {entry[field]}')
    lines.append("# TYPE larder_client_mapped_segments gauge")
    lines.append(f"larder_client_mapped_segments {int(stats.get('mapped_segments', 0))}")
    lines.append("# TYPE larder_client_mapped_bytes gauge")
    lines.append(f"larder_client_mapped_bytes {int(stats.get('mapped_bytes', 0))}")
    return "\n".join(lines) + "\n"


def summary_text(store: larder.Store) -> str:
    stats = json.loads(store.stats_json())
    parts = []
    for route in _ROUTES:
        counters = stats.get("routes", {}).get(route)
        if counters:
            parts.append(f"{route}: {counters.get('requests', 0)} requests, "
                         f"{counters.get('bytes', 0)} bytes, {counters.get('failures', 0)} failed")
    return (f"segment={store.segment_name}, " + ("; ".join(parts) or "no transfers yet")) + "\n"


class ClientHttpServer:
    """Serves the store's metrics on host:port (port 0 picks a free one) from a daemon thread."""

    def __init__(self, store: larder.Store, host: str, port: int) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                owner._serve(self)

            def log_message(self, *args):  # quiet: the store logs what matters
                pass

        self._store = store
        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="larder-client-http")
        self._thread.start()

    def _serve(self, request: BaseHTTPRequestHandler) -> None:
        path = request.path.split("?", 1)[0]
        try:
            if path == "/health":
                body, kind = "OK\n", "text/plain"
            elif path == "/metrics":
                body, kind = metrics_text(self._store), "text/plain; version=0.0.4"
            elif path == "/metrics/summary":
                body, kind = summary_text(self._store), "text/plain; version=0.0.4"
            elif path == "/version":
                body = json.dumps({"version": larder.__version__,
                                   "display_version": f"larder {larder.__version__}"})
                kind = "application/json"
            else:
                body, kind, status = "not found\n", "text/plain", 404
                self._reply(request, status, body, kind)
                return
        except larder.LarderError as e:  # the store was closed under us
            self._reply(request, 503, f"metrics not available: {e.message}\n", "text/plain")
            return
        self._reply(request, 200, body, kind)

    @staticmethod
    def _reply(request, status: int, body: str, kind: str) -> None:
        data = body.encode()
        request.send_response(status)
        request.send_header("Content-Type", kind)
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        request.wfile.write(data)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
