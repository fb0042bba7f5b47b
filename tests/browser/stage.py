"""Several UI stories side by side, so their Dagster runs overlap in time.

A browser test mostly waits: a run is queued, started (two Python processes importing
Dagster), executed and recorded, about half a minute each on 2 cores. Run one story after
the other and the suite takes a quarter of an hour; run them side by side -- each its own
page in the one browser, clicks from the one test thread -- and the runs of different tasks
overlap (each task has its own Dagster pool).

A story is a generator function ``story(stage, page)``: it clicks with ``page`` and, when it
must wait for Dagster, yields a `Wait` (a probe returning None until ready); the stage sends
the probe's value back in. Its return value is its result. The stage advances every started
story whenever a test asks for one (`Stage.finish`) and while a test's CLI call runs
(`DevServer.idle`), so waiting for one is waiting for all.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from browser_support import DevServer, Ready, Wait, note
from playwright.sync_api import Page

#: Seconds between two rounds of probes (each probe is one cheap GraphQL or SQLite query).
POLL_INTERVAL = 2.0


Story = Callable[["Stage", Page], Generator[Wait, Any, Any]]


@dataclass
class _Running:
    name: str
    page: Page
    gen: Generator[Wait, Any, Any]
    waiting: Wait | None = None
    done: bool = False
    result: Any = None
    error: BaseException | None = None
    error_text: str = ""
    started: float = field(default_factory=time.monotonic)


class StoryFailed(AssertionError):
    """A story raised; its traceback is in the message (it ran inside the stage)."""


class Stage:
    """The started stories of the suite and the loop that advances them."""

    def __init__(
        self, server: DevServer, stories: dict[str, Story], new_page: Callable[[], Page]
    ) -> None:
        self.server, self.stories, self.new_page = server, stories, new_page
        self.running: dict[str, _Running] = {}
        self._polling = False
        self._last_poll = 0.0

    # --- starting and finishing stories -------------------------------------------------
    def start(self, name: str) -> None:
        """Start story NAME (once): it clicks until its first wait."""
        if name in self.running:
            return
        page = self.new_page()
        run = _Running(name, page, self.stories[name](self, page))
        self.running[name] = run
        note(f"story {name}: started")
        self._advance(run, None)

    def finish(self, name: str, timeout: float = 900.0) -> Any:
        """Drive every started story until NAME is done; its result (or its error)."""
        self.start(name)
        target = self.running[name]
        deadline = time.monotonic() + timeout
        while not target.done:
            if time.monotonic() > deadline:
                raise StoryFailed(f"story {name} not done within {timeout:.0f} s")
            if not self.poll_once():
                time.sleep(0.2)
        if target.error is not None:
            raise StoryFailed(f"story {name} failed:\n{target.error_text}") from target.error
        return target.result

    def result_of(self, name: str) -> Wait:
        """A wait (for use inside another story) for story NAME's result."""
        self.start(name)

        def probe() -> Any:
            run = self.running[name]
            if not run.done:
                return None
            if run.error is not None:
                raise StoryFailed(f"story {name}, which this one needs, failed") from run.error
            return Ready(run.result)

        return Wait(probe, 900.0, f"story {name}")

    def page_of(self, name: str) -> Page | None:
        run = self.running.get(name)
        return run.page if run else None

    def close(self) -> None:
        for run in self.running.values():
            if not run.done:
                run.gen.close()
            run.page.close()

    # --- the loop --------------------------------------------------------------------------
    def poll_once(self) -> bool:
        """Advance every story whose wait is over; True when one of them moved."""
        if self._polling:  # called again from inside a story's step (e.g. a CLI call)
            return False
        if time.monotonic() - self._last_poll < POLL_INTERVAL:
            return False  # probes are GraphQL queries: the webserver shares the 2 cores
        self._last_poll = time.monotonic()
        self._polling = True
        try:
            return self._poll()
        finally:
            self._polling = False

    def _poll(self) -> bool:
        moved = False
        for run in list(self.running.values()):
            if run.done or run.waiting is None:
                continue
            wait = run.waiting
            try:
                value = wait.probe()
            except Exception as exc:
                self._advance(run, exc, throw=True)
                moved = True
                continue
            if value is not None:
                self._advance(run, value.value if isinstance(value, Ready) else value)
                moved = True
            elif time.monotonic() > wait.deadline:
                timeout = AssertionError(f"{wait.message}: not within {wait.timeout:.0f} s")
                self._advance(run, timeout, throw=True)
                moved = True
        return moved

    def _advance(self, run: _Running, value: Any, *, throw: bool = False) -> None:
        try:
            wait = run.gen.throw(value) if throw else run.gen.send(value)
        except StopIteration as stop:
            run.done, run.result, run.waiting = True, stop.value, None
            note(f"story {run.name}: done after {time.monotonic() - run.started:.0f}s")
        except Exception as exc:
            run.done, run.error, run.waiting = True, exc, None
            run.error_text = traceback.format_exc()
            note(f"story {run.name}: failed: {type(exc).__name__}: {str(exc)[:300]}")
        else:
            assert isinstance(wait, Wait), f"story {run.name} yielded {wait!r}, not a Wait"
            run.waiting = wait
            # While it waits the story's page needs no live updates: an open run page polls
            # the webserver every few seconds, and CPU is what the runs are short of.
            with contextlib.suppress(Exception):
                run.page.goto("about:blank")
