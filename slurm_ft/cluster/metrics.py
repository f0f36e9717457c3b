"""A tiny Prometheus text exposition for the monitor (no client library needed).

Counters ``slurm_ft_failures_total{category}``, ``slurm_ft_restarts_total``, ``slurm_ft_stops_total``, gauge
``slurm_ft_quarantined_nodes``, ``slurm_ft_quarantine_store_ok`` (0 when the store cannot be read: quarantine
decisions are off until it is repaired) and a summary ``slurm_ft_recovery_seconds`` (sum and count). Served on
127.0.0.1 only, by ``http.server`` in a daemon thread.
"""

from __future__ import annotations

import http.server
import threading

PREFIX = "slurm_ft_"


class Metrics:
    """Thread-safe counters the monitor updates and the HTTP thread renders."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.failures: dict[str, int] = {}
        self.restarts = 0
        self.stops = 0
        self.quarantined_nodes = 0
        self.quarantine_store_ok = 1
        self.recovery_sum = 0.0
        self.recovery_count = 0

    def failure(self, category: str) -> None:
        with self._lock:
            self.failures[category] = self.failures.get(category, 0) + 1

    def restart(self) -> None:
        with self._lock:
            self.restarts += 1

    def stop(self) -> None:
        with self._lock:
            self.stops += 1

    def set_quarantined(self, count: int) -> None:
        with self._lock:
            self.quarantined_nodes = int(count)

    def set_store_ok(self, ok: bool) -> None:
        with self._lock:
            self.quarantine_store_ok = int(bool(ok))

    def recovery(self, seconds: float) -> None:
        with self._lock:
            self.recovery_sum += max(0.0, float(seconds))
            self.recovery_count += 1

    def render(self) -> str:
        """The Prometheus text format (version 0.0.4)."""
        with self._lock:
            lines = [f"# HELP {PREFIX}failures_total Failed --ft jobs seen, by category.",
                     f"# TYPE {PREFIX}failures_total counter"]
            lines += [f'{PREFIX}failures_total{{category="{_label(c)}"}} {n}' for c, n in sorted(self.failures.items())]
            lines += [f"# HELP {PREFIX}restarts_total Jobs requeued by the monitor.",
                      f"# TYPE {PREFIX}restarts_total counter", f"{PREFIX}restarts_total {self.restarts}",
                      f"# HELP {PREFIX}stops_total Jobs left stopped by the monitor.",
                      f"# TYPE {PREFIX}stops_total counter", f"{PREFIX}stops_total {self.stops}",
                      f"# HELP {PREFIX}quarantined_nodes Nodes in quarantine.",
                      f"# TYPE {PREFIX}quarantined_nodes gauge",
                      f"{PREFIX}quarantined_nodes {self.quarantined_nodes}",
                      f"# HELP {PREFIX}quarantine_store_ok 0 when the quarantine store cannot be read (see the log).",
                      f"# TYPE {PREFIX}quarantine_store_ok gauge",
                      f"{PREFIX}quarantine_store_ok {self.quarantine_store_ok}",
                      f"# HELP {PREFIX}recovery_seconds From job end seen to the job running again.",
                      f"# TYPE {PREFIX}recovery_seconds summary",
                      f"{PREFIX}recovery_seconds_sum {self.recovery_sum:.3f}",
                      f"{PREFIX}recovery_seconds_count {self.recovery_count}"]
        return "\n".join(lines) + "\n"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def serve(metrics: Metrics, port: int, host: str = "127.0.0.1") -> http.server.ThreadingHTTPServer:
    """Serve ``metrics`` at ``http://host:port/metrics`` in a daemon thread; port 0 picks a free one."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server API
            if self.path.split("?", 1)[0] not in ("/metrics", "/"):
                self.send_error(404)
                return
            body = metrics.render().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:  # quiet: the monitor logs what matters
            return

    server = http.server.ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="slurm-ft-metrics", daemon=True).start()
    return server
