"""Progress of a pull or a build, as events; sinks for people and for programs.

A `ProgressSink` is anything with `emit(event)`. The store calls it from the
event loop's thread or from a worker thread, so sinks must be thread-safe
(all three here are). Events:

```
resolve   ref, digest                     the manifest is known
blob      digest, size, done, state       state: start | progress | done | cached
flatten   digest, layers, done, state     state: start | layer | done
ready     ref, digest, rootfs, size       the root disk exists
note      message                         one line for a person
```
"""

from __future__ import annotations

import json
import os
import sys
import threading
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, TextIO


@dataclass(frozen=True, slots=True)
class ProgressEvent:
    kind: str
    digest: str = ""
    ref: str = ""
    size: int = 0
    done: int = 0
    state: str = ""
    message: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if v not in ("", {}, None)}
        extra = d.pop("extra", {})
        d.update(extra)
        return d


class ProgressSink(Protocol):
    def emit(self, event: ProgressEvent) -> None: ...


class NullProgress:
    def emit(self, event: ProgressEvent) -> None:
        pass


class JsonProgress:
    """One JSON object per line, flushed, for programs (`--json`)."""

    def __init__(self, out: TextIO | None = None, *, every: int = 4 * 1024 * 1024) -> None:
        self.out = out or sys.stdout
        self.every = every
        self._last: dict[str, int] = {}
        self._lock = threading.Lock()

    def emit(self, event: ProgressEvent) -> None:
        if event.kind == "blob" and event.state == "progress":
            last = self._last.get(event.digest, 0)
            if event.done - last < self.every:
                return
            self._last[event.digest] = event.done
        with self._lock:
            self.out.write(json.dumps({"event": event.kind, **event.to_json()}) + "\n")
            self.out.flush()


class RichProgress:
    """A bar per layer on a terminal (stderr)."""

    def __init__(self) -> None:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TaskID,
            TextColumn,
            TransferSpeedColumn,
        )

        self._progress = Progress(
            TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
            TransferSpeedColumn(), transient=False,
        )
        self._tasks: dict[str, TaskID] = {}
        self._lock = threading.Lock()
        self._started = False

    def _ensure(self) -> None:
        if not self._started:
            self._progress.start()
            self._started = True

    def emit(self, event: ProgressEvent) -> None:
        with self._lock:
            self._ensure()
            p = self._progress
            if event.kind == "blob":
                short = event.digest.removeprefix("sha256:")[:12]
                tid = self._tasks.get(event.digest)
                if tid is None:
                    tid = self._tasks[event.digest] = p.add_task(short, total=event.size or None)
                if event.state == "cached":
                    p.update(tid, description=f"{short} cached", completed=event.size)
                elif event.state == "done":
                    p.update(tid, completed=event.size)
                else:
                    p.update(tid, completed=event.done)
            elif event.kind == "flatten":
                tid = self._tasks.get("flatten")
                if tid is None:
                    tid = self._tasks["flatten"] = p.add_task(
                        "root disk", total=max(1, event.size))
                p.update(tid, completed=event.done)
            elif event.kind in ("note", "ready"):
                p.console.print(event.message or f"ready: {event.ref} {event.digest}")

    def close(self) -> None:
        with self._lock:
            if self._started:
                self._progress.stop()
                self._started = False


def auto_progress(*, json_events: bool = False) -> NullProgress | JsonProgress | RichProgress:
    """JSON events if asked; bars on a terminal; quiet when not a tty or `CI` is set."""
    if json_events:
        return JsonProgress()
    if os.environ.get("CI") or not sys.stderr.isatty():
        return NullProgress()
    return RichProgress()
