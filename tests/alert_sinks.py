"""Real local servers that notifications and alerts are sent to, and the fake alert channel.

- :class:`WebhookSink`: an HTTP server (``http.server``) on 127.0.0.1 in a thread; keeps every
  POST (path, headers, JSON body); answers ``status`` (set it to 500 for a channel that is
  down but listening) with the body ``answer`` when it is not 200.
- :class:`SmtpSink`: a minimal SMTP server on 127.0.0.1 in a thread; keeps every message;
  refuses the recipients in ``refuse``.
- ``start(sink)`` serves a sink until the context ends; pass ``port`` to a sink to bring it
  up on a port reserved earlier (``free_port``), i.e. after a channel that was not listening.
- :class:`FakeChannel`: an ``AlertChannel`` that records what it is sent and fails on demand.
"""

from __future__ import annotations

import json
import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, TypeVar

from pg_server import free_port

from resources.alert_channels import AlertMessage, ChannelError

__all__ = ["FakeChannel", "SmtpSink", "WebhookSink", "free_port", "start"]


@dataclass(frozen=True)
class Post:
    path: str
    headers: dict[str, str]
    body: Any


class WebhookSink(ThreadingHTTPServer):
    """An HTTP server that keeps the POSTs it gets and answers ``status``."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _WebhookHandler)
        self.received: list[Post] = []
        self.status = 200
        #: The body of a non-200 answer.
        self.answer = b"upstream exploded"
        self.lock = threading.Lock()

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def url(self, path: str = "/hooks/T000/B000/secret-token") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def bodies(self) -> list[Any]:
        with self.lock:
            return [p.body for p in self.received if p.headers.get("x-answered") == "200"]


class _WebhookHandler(BaseHTTPRequestHandler):
    server: WebhookSink

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        status = self.server.status
        headers = {k.lower(): v for k, v in self.headers.items()}
        headers["x-answered"] = str(status)
        with self.server.lock:
            self.server.received.append(Post(self.path, headers, json.loads(raw or b"null")))
        answer = b"ok" if status == 200 else self.server.answer
        self.send_response(status)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        return  # keep the test output clean


class SmtpSink(socketserver.ThreadingTCPServer):
    """A minimal SMTP server on 127.0.0.1 that keeps what it receives."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), _SmtpHandler)
        self.received: list[Message] = []
        self.refuse: set[str] = set()
        self.lock = threading.Lock()

    @property
    def port(self) -> int:
        return int(self.server_address[1])


class _SmtpHandler(socketserver.StreamRequestHandler):
    server: SmtpSink

    def reply(self, line: str) -> None:
        self.wfile.write(f"{line}\r\n".encode())
        self.wfile.flush()

    def handle(self) -> None:
        self.reply("220 sink ready")
        while True:
            line = self.rfile.readline()
            if not line:
                return
            command = line.decode().strip()
            verb = command.split(" ", 1)[0].upper()
            if verb in ("EHLO", "HELO"):
                self.reply("250 sink")
            elif verb == "RCPT":
                address = command.split(":", 1)[1].strip().strip("<>")
                with self.server.lock:
                    refused = address in self.server.refuse
                self.reply("550 no such user" if refused else "250 ok")
            elif verb == "DATA":
                self.reply("354 end with .")
                data = bytearray()
                while (chunk := self.rfile.readline()) not in (b".\r\n", b""):
                    data += chunk[1:] if chunk.startswith(b"..") else chunk
                with self.server.lock:
                    self.server.received.append(message_from_bytes(bytes(data)))
                self.reply("250 queued")
            elif verb == "QUIT":
                self.reply("221 bye")
                return
            else:  # MAIL, RSET, NOOP
                self.reply("250 ok")


S = TypeVar("S", bound=socketserver.BaseServer)


@contextmanager
def start(sink: S) -> Iterator[S]:
    """Serve ``sink`` in a thread until the block ends, then close its socket."""
    thread = threading.Thread(target=sink.serve_forever, daemon=True)
    thread.start()
    try:
        yield sink
    finally:
        sink.shutdown()
        sink.server_close()
        thread.join(timeout=5)


@dataclass
class FakeChannel:
    """An alert channel for unit tests: keeps what it is sent; raises while ``down``."""

    name: str = "webhook"
    down: bool = False
    kinds: frozenset[str] | None = None
    timeout_seconds: float = 1.0
    sent: list[AlertMessage] = field(default_factory=list)
    tries: int = 0

    def accepts(self, kind: str) -> bool:
        return self.kinds is None or kind in self.kinds

    def send(self, message: AlertMessage) -> str | None:
        self.tries += 1
        if self.down:
            raise ChannelError(f"{self.name} is down")
        self.sent.append(message)
        return None
