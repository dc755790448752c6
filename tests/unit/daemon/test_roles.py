"""Every collaborator of the box manager, real or fake, plays its role's Protocol.

The fakes in `tkbox.daemon.testing` are what the daemon's integration tests and
the SDK's test daemon run on; the real ones are what `tkbox daemon` wires. A fake
that drifts from its role (a method renamed, one missing) fails here, not as an
AttributeError deep in a test of something else.

`isinstance` against a `runtime_checkable` Protocol is not enough: the fakes name
their Protocol as a base, so a method the fake forgot is still found, inherited from
the Protocol's own body (`...`), and `isinstance` only asks that a name exists. So
`plays` checks structurally: every member the Protocol declares is defined by the
object itself (its class or its instance, never the Protocol's body), a method as a
method (async where the Protocol's is, with the same parameter names and kinds, a
default wherever the Protocol has one; any parameter beyond the Protocol's must be
optional), a property or attribute as data.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest

from tkbox.daemon import roles
from tkbox.daemon.box import DoorFactory
from tkbox.daemon.testing import FakeBuild, FakeBuilder, FakeImage, FakeImages, HoldingDoor
from tkbox.doors.network import ApprovalBoard, EgressDoor, OperatorConfig, SystemClock
from tkbox.doors.network.testing import FakeResolver
from tkbox.errors import UserError
from tkbox.image.store import ImageStore
from tkbox.record.testing import FakeSigner


def _is_protocol_class(c: type) -> bool:
    return bool(c.__dict__.get("_is_protocol", False))


def declared(proto: type) -> Iterator[tuple[str, object]]:
    """(name, what the Protocol's body holds for it) for every member it declares,
    its own and its Protocol bases'."""
    seen: set[str] = set()
    for base in proto.__mro__:
        if base in (Protocol, object) or not _is_protocol_class(base):
            continue
        names = [n for n in base.__dict__ if n == "__call__" or not n.startswith("_")]
        names += list(base.__dict__.get("__annotations__", {}))
        for name in names:
            if name not in seen:
                seen.add(name)
                yield name, base.__dict__.get(name)


def _origin(obj: object, name: str) -> type | None:
    """The class whose body defines `name` for `obj` (None: the instance itself)."""
    if name != "__call__" and name in getattr(obj, "__dict__", {}):
        return None
    for c in type(obj).__mro__:
        if name in c.__dict__ or name in c.__dict__.get("__annotations__", {}):
            return c
    raise LookupError(name)


VAR_POSITIONAL, VAR_KEYWORD = inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD


def _shape(sig: inspect.Signature) -> list[tuple[str, Any, bool]]:
    return [(p.name, p.kind, p.default is not inspect.Parameter.empty)
            for p in sig.parameters.values()]


def plays(obj: object, proto: type) -> list[str]:
    """What `obj` lacks to play `proto` (empty: it plays it)."""
    problems: list[str] = []
    for name, body in declared(proto):
        try:
            origin = _origin(obj, name)
        except LookupError:
            problems.append(f"{name}: missing")
            continue
        if origin is not None and _is_protocol_class(origin):
            problems.append(f"{name}: only the Protocol's own body ({origin.__name__}) has it")
            continue
        mine = origin.__dict__.get(name) if origin is not None else None
        if not inspect.isfunction(body):  # a property or an annotated attribute: data
            if inspect.isfunction(mine):
                problems.append(f"{name}: a method, where the Protocol has data")
            continue
        if name == "__call__":  # a function is its own call; an instance, its class's
            member = obj if inspect.isfunction(obj) else type(obj).__call__.__get__(obj)
        else:
            member = getattr(obj, name, None)
        if not callable(member):
            problems.append(f"{name}: not callable")
            continue
        if inspect.iscoroutinefunction(body) and not inspect.iscoroutinefunction(member):
            problems.append(f"{name}: not async, as the Protocol's is")
        elif inspect.iscoroutinefunction(member) and not inspect.iscoroutinefunction(body):
            problems.append(f"{name}: async, where the Protocol's is not")
        want = _shape(inspect.signature(body))[1:]  # without self
        got = _shape(inspect.signature(member))
        extra = got[len(want):]  # beyond the Protocol's: only optional ones
        if [(n, k) for n, k, _ in want] != [(n, k) for n, k, _ in got[:len(want)]] or any(
                not d and k not in (VAR_POSITIONAL, VAR_KEYWORD) for _, k, d in extra):
            problems.append(f"{name}: parameters {[(n, k.name) for n, k, _ in got]}, the "
                            f"Protocol's {[(n, k.name) for n, k, _ in want]}")
        elif any(d and not g for (_, _, d), (_, _, g) in zip(want, got, strict=False)):
            problems.append(f"{name}: a parameter the Protocol gives a default has none")
    return problems


def test_the_fakes_play_their_roles(tmp_path: Path) -> None:
    images = FakeImages(tmp_path)
    assert isinstance(images, roles.ImageSource)
    assert isinstance(asyncio.run(images.resolve("any")), roles.ResolvedImage)
    assert isinstance(FakeImage("sha256:" + "0" * 64, tmp_path), roles.ResolvedImage)
    build = FakeBuild(tmp_path / "k", tmp_path / "i")
    assert isinstance(build, roles.GuestBuildInfo)
    assert isinstance(FakeBuilder(build), roles.GuestBuilder)
    assert isinstance(FakeBuilder(build)(), roles.GuestBuildInfo)
    assert isinstance(HoldingDoor(), roles.NetworkDoor)
    assert isinstance(lambda box: HoldingDoor(), DoorFactory)
    for fake, role in [(images, roles.ImageSource),
                       (asyncio.run(images.resolve("any")), roles.ResolvedImage),
                       (FakeImage("sha256:" + "0" * 64, tmp_path), roles.ResolvedImage),
                       (build, roles.GuestBuildInfo), (FakeBuilder(build), roles.GuestBuilder),
                       (FakeBuilder(build)(), roles.GuestBuildInfo),
                       (HoldingDoor(), roles.NetworkDoor),
                       (lambda box: HoldingDoor(), DoorFactory)]:
        assert plays(fake, role) == [], (fake, role)


def test_the_real_collaborators_play_their_roles(tmp_path: Path) -> None:
    store = ImageStore(tmp_path / "images")
    try:
        assert isinstance(store, roles.ImageSource)
        assert plays(store, roles.ImageSource) == []
    finally:
        store.close()

    async def doors() -> None:
        signer, clock = FakeSigner(), SystemClock()
        board = ApprovalBoard(signer, clock)
        assert isinstance(board, roles.ApprovalsBoard)
        assert plays(board, roles.ApprovalsBoard) == []
        door = EgressDoor("run-1", signer, [], OperatorConfig(), FakeResolver({}), board, clock,
                          box="b", on_record_lost=lambda exc: None)
        assert isinstance(door, roles.NetworkDoor)
        assert plays(door, roles.NetworkDoor) == []
        await door.close()

    asyncio.run(doors())


def test_a_fake_missing_a_method_is_seen() -> None:
    """The check can fail: a door without `resolve_and_check` is no network door."""

    class HalfDoor:
        ca_pem = None

        async def handle(self, stream: object) -> None: ...

        async def close(self) -> None: ...

    assert not isinstance(HalfDoor(), roles.NetworkDoor)


class _Planted(roles.NetworkDoor):
    """A fake that names its Protocol as a base, as the shipped fakes do, and forgot
    `resolve_and_check`: `isinstance` says yes (the Protocol's body has the name)."""

    ca_pem: str | None = None

    async def handle(self, stream: object) -> None: ...

    async def close(self) -> None: ...


def test_a_fake_that_subclasses_its_protocol_and_misses_a_method_is_seen() -> None:
    planted = _Planted()
    assert isinstance(planted, roles.NetworkDoor)  # what the old check saw: it passed
    assert plays(planted, roles.NetworkDoor) == [
        "resolve_and_check: only the Protocol's own body (NetworkDoor) has it"]
    assert plays(HalfBoard(), roles.ApprovalsBoard) == ["stop_box: missing"]


class HalfBoard:
    def list(self) -> list[object]:
        return []

    async def answer(self, box: str, approval_id: int, allow: bool,
                     via: str = "cli") -> object: ...


class _Drifted(roles.NetworkDoor):
    def ca_pem(self) -> str | None:  # type: ignore[override]  # a method, not a property
        return None

    async def handle(self, conn: object) -> None: ...  # renamed parameter

    def close(self) -> None: ...  # not async

    async def resolve_and_check(self, host: str, port: int = 443) -> Any:
        raise UserError("x")


class _NoDefault(roles.ApprovalsBoard):
    def list(self) -> list[Any]:
        return []

    async def answer(self, box: str, approval_id: int, allow: bool,  # type: ignore[override]
                     via: str) -> Any: ...

    async def stop_box(self, box: str) -> None: ...


@pytest.mark.parametrize("fake, role, said", [
    (_Drifted(), roles.NetworkDoor, ["ca_pem: a method, where the Protocol has data",
                                     "handle: parameters [('conn', 'POSITIONAL_OR_KEYWORD')], "
                                     "the Protocol's [('stream', 'POSITIONAL_OR_KEYWORD')]",
                                     "close: not async, as the Protocol's is"]),
    (_NoDefault(), roles.ApprovalsBoard,
     ["answer: a parameter the Protocol gives a default has none"]),
    (lambda: None, DoorFactory, ["__call__: parameters [], the Protocol's "
                                 "[('box', 'POSITIONAL_OR_KEYWORD')]"]),
])
def test_a_drifted_signature_is_seen(fake: object, role: type, said: list[str]) -> None:
    assert plays(fake, role) == said
