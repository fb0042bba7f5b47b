"""`dueledger metrics serve|write`: the ledger's Prometheus metrics, over HTTP or to a file.

- ``serve [--host 127.0.0.1] [--port 9478]``: a small long-running HTTP server; every scrape
  reads the ledger, the alert log and the Dagster instance anew (orchestration/services/
  metrics.py), so a restart loses nothing. ``--port 0`` takes a free port (printed).
- ``write FILE``: one scrape written atomically to FILE, for node_exporter's textfile
  collector (FILE ending in ``.prom``, from cron or a systemd timer).

The exposition format, the HTTP handler and the atomic file write are ``prometheus_client``'s;
``orchestration/cli/exposition.py`` maps the metric model onto its metric families.
A port that cannot be listened on, or a file that cannot be written, is exit 2 naming it.
"""

from __future__ import annotations

import os
import signal
import stat
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any, Final

import click

from orchestration.cli.runs import viewer_gate
from orchestration.cli.support import dagster_instance, handle_errors, json_option, print_json
from resources.core.errors import InvalidInput

DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_PORT: Final = 9478
ACTION_METRICS: Final = "metrics"


# --- input checks ----------------------------------------------------------------------------


def parse_port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise InvalidInput(
            f"--port {text!r} must be a whole number from 0 to 65535 (0: any free port)"
        )
    return port


def check_writable(path: Path) -> None:
    """FILE is a new path or a regular file, in a directory that exists and is writable: else
    exit 2. The file is written aside and renamed over FILE, so anything else there -- a FIFO
    a collector reads, a device node, a socket -- would be replaced, not written to."""
    where = path.parent
    if path.is_dir():
        raise InvalidInput(f"cannot write metrics to {path}: it is a directory; name a file")
    if path.exists() or path.is_symlink():
        mode = path.lstat().st_mode
        if stat.S_ISLNK(mode) or not stat.S_ISREG(mode):
            kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
            raise InvalidInput(
                f"cannot write metrics to {path}: it is {kind}, which writing would replace; "
                f"name a regular file or a new path"
            )
    if not where.is_dir():
        raise InvalidInput(
            f"cannot write metrics to {path}: directory {where} does not exist; create it or "
            f"name a file in an existing directory"
        )
    if not os.access(where, os.W_OK | os.X_OK):
        raise InvalidInput(
            f"cannot write metrics to {path}: directory {where} is not writable by this user"
        )


def _start_server(host: str, port: int, registry: Any) -> tuple[Any, threading.Thread]:
    """``prometheus_client``'s metrics app on a threaded WSGI server at ``host:port``, in a
    daemon thread. A scrape that fails answers 500 with one line saying what failed (the
    ledger unreachable, say), where the stock server answers only "A server error
    occurred"; Prometheus records the scrape as failed (``up == 0``) either way."""
    import socket
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    from prometheus_client import make_wsgi_app

    metrics_app = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        try:
            return list(metrics_app(environ, start_response))
        except Exception as exc:  # the scrape failed: say what, once, in the body
            detail = (str(exc).strip().splitlines() or [""])[0][:500]
            body = f"dueledger metrics: the scrape failed: {type(exc).__name__}: {detail}\n"
            data = body.encode("utf-8", "backslashreplace")
            start_response(
                "500 Internal Server Error",
                [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(data)))],
            )
            return [data]

    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]

    class Server(ThreadingMixIn, WSGIServer):
        daemon_threads = True
        address_family = family

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass  # a scrape every few seconds is not news

    server = make_server(host, port, app, Server, handler_class=QuietHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


_KINDS = {
    stat.S_IFLNK: "a symbolic link",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
}


# --- commands ----------------------------------------------------------------------------------


@click.group("metrics")
def metrics_group() -> None:
    """Prometheus metrics from the ledger: serve them over HTTP, or write them to a file."""


_operator_option = click.option(
    "--operator",
    default=None,
    help="Who reads the metrics (default: your login); checked for the viewer role.",
)


@metrics_group.command("serve")
@click.option("--host", default=DEFAULT_HOST, show_default=True, help="Address to listen on.")
@click.option(
    "--port",
    default=str(DEFAULT_PORT),
    show_default=True,
    help="TCP port to listen on (0: any free port, printed on start).",
)
@_operator_option
@json_option
@handle_errors
def serve_cmd(host: str, port: str, operator: str | None, as_json: bool) -> None:
    """Serve the metrics at http://HOST:PORT/metrics until stopped (SIGTERM or Ctrl-C)."""
    # Imported when a metrics command runs, so the other commands do not load them.
    from prometheus_client import CollectorRegistry

    # The collector, loaded with prometheus_client for the same reason.
    from orchestration.cli.exposition import LedgerCollector, snapshot_source

    number = parse_port(port)
    collector = LedgerCollector()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    # The port first: one in use is exit 2 before the ledger or Dagster is touched.
    try:
        server, thread = _start_server(host, number, registry)
    except OSError as exc:
        raise InvalidInput(
            f"cannot listen on {host}:{number} (--host {host} --port {port}): "
            f"{exc.strerror or exc}; choose another --port, or stop what listens there"
        ) from None
    try:
        ledger = viewer_gate(operator, ACTION_METRICS)
        instance = dagster_instance()
    except BaseException:
        server.shutdown()
        server.server_close()
        raise
    collector.snapshot = snapshot_source(ledger, instance)
    bound = int(server.server_address[1])
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound}/metrics"
    if as_json:
        print_json({"url": url, "host": host, "port": bound})
    else:
        click.echo(f"serving dueledger metrics at {url} (Ctrl-C to stop)")
    sys.stdout.flush()
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    while not stop.wait(1.0) and thread.is_alive():
        pass
    server.shutdown()
    server.server_close()
    instance.dispose()
    ledger.dispose()


@metrics_group.command("write")
@click.argument("file", type=click.Path(dir_okay=True, path_type=Path))
@_operator_option
@json_option
@handle_errors
def write_cmd(file: Path, operator: str | None, as_json: bool) -> None:
    """Write one scrape to FILE atomically (node_exporter's textfile collector reads
    ``*.prom`` files from its --collector.textfile.directory)."""
    # Imported when a metrics command runs, so the other commands do not load them.
    from prometheus_client import CollectorRegistry, write_to_textfile

    # The collector, loaded with prometheus_client for the same reason.
    from orchestration.cli.exposition import LedgerCollector, snapshot_source

    path = file.expanduser().absolute()
    check_writable(path)
    ledger = viewer_gate(operator, ACTION_METRICS)
    with dagster_instance() as instance:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(LedgerCollector(snapshot_source(ledger, instance)))
        started = time.perf_counter()
        try:
            write_to_textfile(str(path), registry)
        except OSError as exc:
            raise InvalidInput(f"cannot write metrics to {path}: {exc.strerror or exc}") from None
        seconds = time.perf_counter() - started
    ledger.dispose()
    families = sum(1 for line in path.read_text().splitlines() if line.startswith("# TYPE "))
    result: dict[str, Any] = {"path": str(path), "families": families, "seconds": seconds}
    if as_json:
        print_json(result)
    else:
        click.echo(f"wrote {families} metric families to {path} in {seconds:.2f} s")
