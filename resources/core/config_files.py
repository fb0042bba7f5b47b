"""Reading the configuration files named by environment variables (``DUELEDGER_ALERTS_FILE``,
``DUELEDGER_OPERATORS``, ``DUELEDGER_HOOKS_FILE``): a regular file, at most
:data:`MAX_CONFIG_BYTES`, UTF-8.

A variable naming ``/dev/zero`` once made a command read forever, and a named pipe with no
writer blocks whoever opens it: the file is opened without blocking, refused unless it is a
regular file, and read up to the bound, so every such mistake fails at once, naming the
variable.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Final

from resources.core.settings import SettingsError

#: The largest configuration file read: these files are a few kilobytes.
MAX_CONFIG_BYTES: Final = 1024 * 1024


class ConfigFileError(SettingsError):
    """A configuration file cannot be used (the message names the variable and the fix)."""


def read_config_file(path: Path, where: str, *, max_bytes: int = MAX_CONFIG_BYTES) -> str:
    """The UTF-8 text of the configuration file at ``path``.

    ``where`` names it in messages (``DUELEDGER_ALERTS_FILE=/etc/x.toml``). A missing file
    raises FileNotFoundError (each caller says what that means for its setting); any other
    problem -- not a regular file, larger than ``max_bytes``, unreadable, not UTF-8 --
    raises :class:`ConfigFileError`.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise ConfigFileError(f"{where}: cannot open the file: {exc.strerror or exc}") from None
    # Checked on the descriptor, before Python wraps it: wrapping a folder's raises.
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a folder" if stat.S_ISDIR(mode) else "a device, pipe or socket"
        raise ConfigFileError(f"{where}: {kind}, not a regular file; name a TOML file")
    with os.fdopen(fd, "rb") as handle:
        try:
            data = handle.read(max_bytes + 1)
        except OSError as exc:
            raise ConfigFileError(f"{where}: cannot read the file: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise ConfigFileError(
            f"{where}: the file is larger than {max_bytes // 1024} KiB; a configuration file "
            f"is a few kilobytes: check that the variable names the right file"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigFileError(
            f"{where}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
            f"save it as UTF-8"
        ) from None
