"""Machines made of Linux network namespaces, for tests/deploy/test_netns_topology.py.

A :class:`Lab` is a set of namespaces named ``dl-<token>-<host>``, each a "machine" with its
own loopback and one interface ``eth0`` on ``10.213.0.<n>/24``, all plugged into a bridge in a
switch namespace ``dl-<token>-sw``. Nothing is added to the host's own network: the veth pairs
are created in the switch namespace with their peer directly in the machine's, and the test
itself talks to the machines from a namespace of its own (:meth:`Lab.inside`, a ``setns`` of
the calling thread only). A **partition** sets a machine's switch port down (its packets are
dropped, as when a cable or a security group cuts it off); **healing** sets it up again.

Cleanup: :meth:`Lab.destroy` deletes every namespace of the lab (their interfaces go with
them); it runs on any exit of the test. A lab records its owner's pid under
``/run/dueledger-netns/``; :func:`remove_stale_labs` deletes the ``dl-`` namespaces of labs
whose owner is gone (a test run that was killed), and only those.

Needs root (``ip netns``) and iproute2 (scripts/test.sh installs it when missing).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import shutil
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

PREFIX = "dl-"
SUBNET = "10.213.0"
RECORDS = Path("/run/dueledger-netns")
CLONE_NEWNET = 0x40000000
T = TypeVar("T")
_libc = ctypes.CDLL(None, use_errno=True)


class LabError(RuntimeError):
    """The namespaces cannot be made (not root, no iproute2, no bridge support)."""


def _ip(*args: str) -> str:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise LabError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")
    return result.stdout


def namespaces() -> list[str]:
    """Every network namespace's name (``ip netns list``)."""
    return [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_labs() -> list[str]:
    """Delete the namespaces of labs whose owner process is gone; returns their names."""
    removed = []
    for name in namespaces():
        if not name.startswith(PREFIX) or name.count("-") < 2:
            continue
        token = name.split("-")[1]
        record = RECORDS / token
        try:
            owner = int(record.read_text().strip())
        except (OSError, ValueError):
            owner = 0
        if owner and _alive(owner):
            continue  # a lab of a test that is running now
        _ip("netns", "del", name)
        removed.append(name)
        record.unlink(missing_ok=True)
    return removed


def _setns(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise LabError(f"setns({path}) failed: {os.strerror(err)}")
    finally:
        os.close(fd)


class Lab:
    """Namespaces ``hosts`` (plus the switch), created by :meth:`create`."""

    def __init__(self, hosts: Sequence[str]) -> None:
        self.token = uuid.uuid4().hex[:6]
        self.hosts = list(hosts)
        self.created: list[str] = []

    def ns(self, host: str) -> str:
        return f"{PREFIX}{self.token}-{host}"

    def address(self, host: str) -> str:
        return f"{SUBNET}.{10 + self.hosts.index(host)}"

    @property
    def network(self) -> str:
        return f"{SUBNET}.0/24"

    def _port(self, host: str) -> str:
        return f"dl{self.token}p{self.hosts.index(host)}"

    def create(self) -> None:
        if os.geteuid() != 0:
            raise LabError("network namespaces need root (run the cluster tests as root)")
        if shutil.which("ip") is None:
            raise LabError("`ip` (iproute2) is missing: scripts/test.sh installs it as root")
        RECORDS.mkdir(parents=True, exist_ok=True)
        (RECORDS / self.token).write_text(str(os.getpid()))
        switch = self.ns("sw")
        _ip("netns", "add", switch)
        self.created.append(switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for host in self.hosts:
            name = self.ns(host)
            _ip("netns", "add", name)
            self.created.append(name)
            port = self._port(host)
            _ip("-n", switch, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                "netns", name)  # fmt: skip
            _ip("-n", switch, "link", "set", port, "master", "br0")
            _ip("-n", switch, "link", "set", port, "up")
            _ip("-n", name, "link", "set", "lo", "up")
            _ip("-n", name, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")

    def partition(self, host: str) -> None:
        """Cut ``host`` off from every other machine."""
        _ip("-n", self.ns("sw"), "link", "set", self._port(host), "down")

    def heal(self, host: str) -> None:
        _ip("-n", self.ns("sw"), "link", "set", self._port(host), "up")

    def destroy(self) -> None:
        """Delete every namespace of the lab (idempotent)."""
        for name in reversed(self.created):
            with contextlib.suppress(LabError):
                _ip("netns", "del", name)
        self.created.clear()
        (RECORDS / self.token).unlink(missing_ok=True)

    @contextlib.contextmanager
    def inside(self, host: str) -> Iterator[None]:
        """The calling thread (only it, and threads it starts meanwhile) in ``host``'s
        namespace; back in its own afterwards, whatever happens."""
        own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            _setns(f"/run/netns/{self.ns(host)}")
            try:
                yield
            finally:
                if _libc.setns(own, CLONE_NEWNET) != 0:
                    raise LabError("could not return to the test's own network namespace")
        finally:
            os.close(own)

    def run_in(self, host: str, work: Callable[[], T]) -> T:
        """``work()`` on a thread in ``host``'s namespace: what it starts (a server forked by
        it) lives on that machine."""
        result: list[T] = []
        errors: list[BaseException] = []

        def target() -> None:
            try:
                _setns(f"/run/netns/{self.ns(host)}")
                result.append(work())
            except BaseException as exc:  # re-raised in the caller
                errors.append(exc)

        thread = threading.Thread(target=target, name=f"in-{host}")
        thread.start()
        thread.join()
        if errors:
            raise errors[0]
        return result[0]

    def wrapper(
        self, host: str, executable: str, folder: Path, env: dict[str, str] | None = None
    ) -> Path:
        """A script that runs ``executable`` with its arguments on ``host``, with ``env``
        added (for multiprocessing's spawn: the code server's run workers on their own
        machine)."""
        path = folder / f"python-on-{host}"
        exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in (env or {}).items())
        run = f'exec ip netns exec {self.ns(host)} {shlex.quote(executable)} "$@"\n'
        path.write_text("#!/bin/sh\n" + exports + run)
        path.chmod(0o755)
        return path
