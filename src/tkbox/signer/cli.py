"""`tkbox signer …` and `tkbox witness …` (typer apps the main CLI mounts).

    tkbox signer init [--dev|--system]   key, store, policy file, trust file
    tkbox signer serve                   run the signer (foreground)
    tkbox signer status                  ask the running signer who it is
    tkbox signer hold|release|quarantine RUN [--reason …]
    tkbox signer add-witness NAME VKEY URL [--independent]
    tkbox signer trust [-o FILE]         print or write the trust file

    tkbox witness init [--name NAME]     a witness key
    tkbox witness add-log VKEY           accept checkpoints of this log
    tkbox witness serve [--listen 127.0.0.1:PORT]

Errors end each command through `tkbox._exit.exit_with`, as every `tkbox` verb's do:
one line `tkbox: error: …` on stderr and the status of the error's class.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from tkbox import paths
from tkbox._exit import exit_with
from tkbox._process import not_dumpable
from tkbox.errors import HostError, SignerRefused, SignerUnavailable, TkboxError, UserError
from tkbox.signer import config as config_mod

signer_app = typer.Typer(help="The signer: decides and signs every crossing.",
                         no_args_is_help=True)
witness_app = typer.Typer(help="A witness: cosigns signers' checkpoints (C2SP tlog-witness).",
                          no_args_is_help=True)

Home = Annotated[Path | None, typer.Option("--home", help="the signer's directory "
                                           "(default: $TKBOX_HOME/signer)")]
Socket = Annotated[Path | None, typer.Option("--socket", help="the signer's socket "
                                             "(default: $TKBOX_SIGNER_SOCKET or "
                                             "$TKBOX_RUNTIME/signer.sock)")]
Json = Annotated[bool, typer.Option("--json", help="output for programs")]


def _home(home: Path | None) -> Path:
    return home or paths.signer_home()


def _socket(sock: Path | None) -> Path:
    return sock or paths.signer_socket()


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")


@signer_app.command("init")
def init_cmd(
    dev: Annotated[bool, typer.Option("--dev", help="everything under your own user "
                                      "(same-user isolation)")] = False,
    system: Annotated[bool, typer.Option("--system", help="a dedicated user and a systemd "
                                         "unit (run as root)")] = False,
    home: Home = None,
    origin: Annotated[str | None, typer.Option(help="the log's name (default: random)")] = None,
    user: Annotated[str, typer.Option(help="--system: the signer's user")] = "tkbox-signer",
    group: Annotated[str, typer.Option(help="--system: the group allowed to connect")] = "tkbox",
    root: Annotated[Path, typer.Option(help="--system: write under this root instead of / "
                                       "(for packaging and tests)")] = Path("/"),
    dry_run: Annotated[bool, typer.Option("--dry-run", help="--system: say what would be "
                                          "done")] = False,
) -> None:
    """Create the signer's key, log, policy file and trust file."""
    if dev and system:
        exit_with(UserError("choose one of --dev and --system"))
    try:
        if system:
            from tkbox.signer import system as system_mod

            plan = system_mod.plan(user=user, group=group, origin=origin)
            for line in system_mod.apply(plan, root=root, dry_run=dry_run):
                typer.echo(line)
            return
        cfg = config_mod.init(_home(home), origin=origin, mode="dev")
        signer = cfg.signer()
    except TkboxError as exc:
        exit_with(exc)
    typer.echo(f"signer {signer.name} in {cfg.home} (dev: same user as the daemon)")
    typer.echo(f"verifier key: {signer.verifier().vkey()}")
    typer.echo(f"trust file:   {cfg.trust_path}")
    typer.echo("next: tkbox signer serve")


@signer_app.command("serve")
def serve_cmd(home: Home = None, socket: Socket = None,
              verbose: Annotated[bool, typer.Option("-v", "--verbose")] = False,
              policy_workers: Annotated[int | None, typer.Option(
                  "--policy-workers", min=0, max=16,
                  help="processes that evaluate new requests beside the event loop "
                       "(default: one per core beyond the first, at most 4; 0: none)")] = None,
              listen: Annotated[str | None, typer.Option(
                  help="also serve daemons of other hosts over TLS on HOST:PORT "
                       "(docs/signer.md: the signer as a network service)")] = None,
              tls_cert: Annotated[Path | None, typer.Option(
                  help="--listen: the signer's certificate chain (PEM)")] = None,
              tls_key: Annotated[Path | None, typer.Option(
                  help="--listen: its private key (PEM)")] = None,
              client_ca: Annotated[Path | None, typer.Option(
                  help="--listen: the CA whose client certificates may record (pinned)")] = None,
              oidc_issuer: Annotated[str | None, typer.Option(
                  help="--listen: an OIDC issuer whose workload tokens may record, e.g. "
                       "https://token.actions.githubusercontent.com")] = None,
              oidc_audience: Annotated[str | None, typer.Option(
                  help="--oidc-issuer: the audience its tokens must name")] = None,
              oidc_allow: Annotated[list[str] | None, typer.Option(
                  help="--oidc-issuer: a repository that may record (OWNER/REPO or OWNER/*; "
                       "repeat; default: any the issuer vouches for)")] = None,
              oidc_ca: Annotated[Path | None, typer.Option(
                  help="--oidc-issuer: CA to reach the issuer with (default: the system's)")
              ] = None,
              store: Annotated[str | None, typer.Option(
                  help="the log's store: postgresql://USER@HOST/DB for a signer many hosts "
                       "share (password from PGPASSFILE or PGPASSWORD); default: the home's "
                       "SQLite log.db")] = None,
              ) -> None:
    """Run the signer in the foreground (its own process; ideally its own user)."""
    _setup_logging(verbose)
    not_dumpable("tkbox signer")  # it holds the signing key
    from tkbox.signer.server import serve

    try:
        remote = _remote_config(listen, tls_cert, tls_key, client_ca, oidc_issuer,
                                oidc_audience, oidc_allow or [], oidc_ca)
        cfg = config_mod.load(_home(home))
        sock = _socket(socket)
        if cfg.mode == "dev":
            paths.private_dir(sock.parent)
        asyncio.run(serve(cfg, sock, policy_workers, remote, store))
    except TkboxError as exc:
        exit_with(exc)
    except RuntimeError as exc:
        exit_with(HostError(str(exc)))


def _remote_config(listen: str | None, cert: Path | None, key: Path | None,
                   client_ca: Path | None, issuer: str | None, audience: str | None,
                   allow: list[str], oidc_ca: Path | None) -> Any:
    """The network listener's settings (`signer.remote`), or None without --listen."""
    given = [n for n, v in (("--tls-cert", cert), ("--tls-key", key), ("--client-ca", client_ca),
                            ("--oidc-issuer", issuer)) if v is not None]
    if listen is None:
        if given:
            raise UserError(f"{given[0]} is for --listen HOST:PORT")
        return None
    from tkbox.signer.oidc import Issuer
    from tkbox.signer.remote import RemoteConfig, parse_listen

    if cert is None or key is None:
        raise UserError("--listen needs --tls-cert and --tls-key (the signer's TLS identity)")
    if (issuer is None) != (audience is None):
        raise UserError("--oidc-issuer and --oidc-audience go together")
    if allow and issuer is None:
        raise UserError("--oidc-allow is for --oidc-issuer")
    host, port = parse_listen(listen)
    issuers = [] if issuer is None or audience is None else [
        Issuer(issuer, audience, tuple(allow), str(oidc_ca) if oidc_ca else None)]
    rc = RemoteConfig(host, port, cert, key, client_ca, issuers)
    rc.check()
    rc.context()  # a certificate or key that cannot be used: say so before serving
    return rc


async def _ask(sock: Path, op: str, **args: Any) -> dict[str, Any]:
    """One request to the running signer on its socket, for an operator's command.

    The signer's own small client (the daemon's `tkbox.record.unix` is not the
    signer's to import): one connection, one frame out, frames in until the
    answer with our id (pushes are not asked for, so none come). Fails as the
    daemon's client does: `SignerUnavailable`, or `SignerRefused` for a request
    the signer will not take.
    """
    from tkbox.formats import wire

    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_unix_connection(str(sock), limit=wire.MAX_FRAME + 4), 2.0)
    except FileNotFoundError:
        raise SignerUnavailable(
            f"no signer at {sock}; start one with `tkbox signer serve`") from None
    except (TimeoutError, OSError) as exc:
        raise SignerUnavailable(f"the signer at {sock} does not answer "
                                f"({_why(exc)}); check `tkbox signer status`") from None
    try:
        writer.write(wire.encode({"id": 1, "op": op, **args}))
        await writer.drain()
        decoder = wire.Decoder()
        async with asyncio.timeout(5.0):
            while True:
                while (frame := decoder.next()) is not None:
                    if frame.get("id") != 1:
                        continue
                    result, error = frame.get("result"), frame.get("error")
                    if frame.get("ok") is True and isinstance(result, dict):
                        return result
                    if frame.get("kind") == "refused" and isinstance(error, str):
                        raise SignerRefused(f"the signer refused: {error}")
                    raise SignerUnavailable(
                        f"the signer refused: {error}" if isinstance(error, str) else
                        "the signer sent an answer that is neither a result nor an error")
                data = await reader.read(1 << 16)
                if not data:
                    raise SignerUnavailable("the signer closed the connection")
                decoder.feed(data)
    except TimeoutError:
        raise SignerUnavailable(f"the signer at {sock} did not answer {op} within 5 s; "
                                "check `tkbox signer status`") from None
    except wire.WireError as exc:
        raise SignerUnavailable(f"the signer sent a bad frame ({exc})") from None
    except (ConnectionError, OSError) as exc:
        raise SignerUnavailable(
            f"the connection to the signer broke ({_why(exc)})") from None
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()


def _why(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or exc.__class__.__name__


@signer_app.command("status")
def status_cmd(socket: Socket = None, json_out: Json = False) -> None:
    """Ask the running signer who it is, how large its log is, what it holds."""
    try:
        st = asyncio.run(_ask(_socket(socket), "status"))
    except TkboxError as exc:
        exit_with(exc)
    if json_out:
        typer.echo(json.dumps(st, indent=2, sort_keys=True))
        return
    typer.echo(f"signer:    {st['key']}")
    typer.echo(f"isolation: {st['isolation']} (you are uid {st['peer_uid']}, the signer "
               f"uid {st['uid']})")
    typer.echo("memory:    " + ("not readable by other processes of its user (undumpable)"
                             if st.get("undumpable") else
                             "READABLE by other processes of its user (it could not make "
                             "itself undumpable)"))
    typer.echo(f"log:       {st['size']} records" + (f" in {st['store']}" if st.get("store")
                                                       else ""))
    if st.get("listen"):
        typer.echo(f"network:   {st['listen']} ({st.get('remote_connections', 0)} daemons "
                   "connected)")
    runs = ", ".join(f"{v} {k}" for k, v in sorted(st["runs"].items()))
    typer.echo(f"runs:      {runs or 'none'}")
    typer.echo(f"policy:    {st['policy']}")
    pw = st.get("policy_workers") or {}
    if pw.get("count"):
        typer.echo(f"workers:   {pw['ready']} of {pw['count']} policy workers ready; "
                   f"{pw['evaluated']} requests evaluated by them, {pw['fell_back']} "
                   "taken back to the signer's loop")
    if st.get("policy_error"):
        typer.echo(f"POLICY ERROR (every decision is refused): {st['policy_error']}")
    typer.echo(f"witnesses: {', '.join(st['witnesses']) or 'none (assurance: dev)'}")
    for kind in ("held", "quarantined"):
        if st.get(kind):
            typer.echo(f"{kind}: {', '.join(st[kind])}")


def _admin(op: str, run: str, reason: str, socket: Path | None) -> None:
    try:
        res = asyncio.run(_ask(_socket(socket), op, run=run, reason=reason))
    except TkboxError as exc:
        exit_with(exc)
    typer.echo(f"{op}: run {run} (record {res['seq']}); the daemon is told at once")


Reason = Annotated[str, typer.Option("--reason", help="why, for the record")]


@signer_app.command("hold")
def hold_cmd(run: str, reason: Reason = "", socket: Socket = None) -> None:
    """Hold a run: its VM is paused and its decisions refused until released."""
    _admin("hold", run, reason, socket)


@signer_app.command("release")
def release_cmd(run: str, reason: Reason = "", socket: Socket = None) -> None:
    """Release a held run: its VM resumes."""
    _admin("release", run, reason, socket)


@signer_app.command("quarantine")
def quarantine_cmd(run: str, reason: Reason = "", socket: Socket = None) -> None:
    """Quarantine a run: its VM is killed; only events and the close are recorded."""
    _admin("quarantine", run, reason, socket)


@signer_app.command("add-witness")
def add_witness_cmd(
    name: Annotated[str, typer.Argument(help="a short label for the policy")],
    vkey: Annotated[str, typer.Argument(help="the witness's verifier key (type 0x04)")],
    url: Annotated[str, typer.Argument(help="its submission prefix, e.g. http://127.0.0.1:7380")],
    independent: Annotated[bool, typer.Option(help="run by someone other than you")] = False,
    quorum: Annotated[int | None, typer.Option(help="how many witnesses must cosign "
                                               "(default: all)")] = None,
    home: Home = None,
) -> None:
    """Submit checkpoints to a witness, and require its cosignature in exports."""
    from tkbox.formats import FormatError

    try:
        cfg = config_mod.load(_home(home))
        w = config_mod.WitnessConf(name, vkey, url, independent)
        w.verifier()
        cfg.witnesses = [x for x in cfg.witnesses if x.name != name] + [w]
        if quorum is not None:
            cfg.quorum = quorum
        cfg.save()
        config_mod.write_trust(cfg)
    except FormatError as exc:
        exit_with(UserError(f"bad witness: {exc.what}"))
    except TkboxError as exc:
        exit_with(exc)
    typer.echo(f"witness {name} added; restart `tkbox signer serve` to use it")


@signer_app.command("trust")
def trust_cmd(home: Home = None,
              out: Annotated[Path | None, typer.Option("-o", help="write it here")] = None) -> None:
    """The trust file that exports carry (the signer's key and witness policy)."""
    try:
        data = config_mod.write_trust(config_mod.load(_home(home)))
    except TkboxError as exc:
        exit_with(exc)
    if out is None:
        sys.stdout.buffer.write(data)
    else:
        from tkbox._fs import write_atomic

        write_atomic(out, data)


# --- the witness ------------------------------------------------------------


def _witness_home(home: Path | None) -> Path:
    return home or paths.home() / "witness"


WHome = Annotated[Path | None, typer.Option("--home", help="the witness's directory "
                                            "(default: $TKBOX_HOME/witness)")]


@witness_app.command("init")
def witness_init_cmd(
    name: Annotated[str | None, typer.Option(help="the witness's name (default: random)")] = None,
    home: WHome = None,
) -> None:
    """Create a witness key."""
    from tkbox.signer import witness

    try:
        w = witness.init(_witness_home(home), name)
    except TkboxError as exc:
        exit_with(exc)
    typer.echo(f"witness {w.name} in {_witness_home(home)}")
    typer.echo(f"verifier key: {w.verifier().vkey()}")
    typer.echo("next: tkbox witness add-log <the signer's verifier key>; tkbox witness serve")


@witness_app.command("add-log")
def witness_add_log_cmd(vkey: str, home: WHome = None) -> None:
    """Accept checkpoints from the log with this verifier key."""
    from tkbox.signer import witness

    try:
        origin = witness.add_log(_witness_home(home), vkey)
    except TkboxError as exc:
        exit_with(exc)
    typer.echo(f"witnessing {origin}")


@witness_app.command("serve")
def witness_serve_cmd(
    listen: Annotated[str, typer.Option(help="host:port (loopback by default)")] = "127.0.0.1:7380",
    home: WHome = None,
    verbose: Annotated[bool, typer.Option("-v", "--verbose")] = False,
) -> None:
    """Serve C2SP tlog-witness add-checkpoint over HTTP."""
    _setup_logging(verbose)
    from tkbox.signer import witness

    host, _, port = listen.rpartition(":")
    if not port.isdigit():
        exit_with(UserError(f"--listen {listen!r}: expected host:port"))
    try:
        witness.serve(_witness_home(home), host or "127.0.0.1", int(port))
    except TkboxError as exc:
        exit_with(exc)


def main() -> None:  # pragma: no cover - `python -m tkbox.signer.cli`
    app = typer.Typer(pretty_exceptions_enable=False)
    app.add_typer(signer_app, name="signer")
    app.add_typer(witness_app, name="witness")
    try:
        app()
    except TkboxError as exc:
        exit_with(exc)


if __name__ == "__main__":  # pragma: no cover
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
