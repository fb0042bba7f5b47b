"""Long-lived child processes in tests (``dagster dev``, ``dagster-daemon run``): started in
their own process group with SIGINT/SIGTERM restored, stopped group-wide, never left behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO


def restore_default_signals() -> None:
    """Undo SIGINT, SIGTERM and SIGQUIT inherited as ignored (a process started in the
    background): SIGINT raises KeyboardInterrupt again, the others end the process. What this
    process starts inherits the defaults, so a Dagster process or a run's compute-log mirror
    stops when Dagster (or a test) asks it to."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGQUIT):
        if signal.getsignal(sig) is signal.SIG_IGN:
            signal.signal(sig, signal.SIG_DFL)


def _restore_signals() -> None:
    # In the child, before exec: a handler does not survive exec, SIG_DFL does.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.setsid()


def start_group(
    cmd: Sequence[str], *, cwd: str | os.PathLike[str], env: Mapping[str, str], log: IO[bytes]
) -> subprocess.Popen[bytes]:
    """Start ``cmd`` as the leader of a new process group, output to ``log``."""
    return subprocess.Popen(
        list(cmd),
        cwd=Path(cwd),
        env=dict(env),
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=_restore_signals,
    )


def stop_group(proc: subprocess.Popen[bytes], timeout: float = 30) -> None:
    """SIGTERM the process group, wait, then SIGKILL whatever is left of it."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=timeout)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # children that outlived their leader, too
    proc.wait(timeout=10)
