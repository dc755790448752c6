"""The boot config a box's guest reads once (port 1026), and the guest's one answer.

`boot_config` is built from the box, its spec, the daemon's options and the
image's run config; `image_user` reads the image's own user database from its
root disk (blocking: the manager runs it off the loop).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from tkbox.daemon.box import Box
from tkbox.daemon.core import BoxSpec, Options
from tkbox.daemon.roles import ResolvedImage
from tkbox.image.runconfig import RunUser, image_env, recorded_names, user_of

PROXY_URL = "http://127.0.0.1:3128"


def boot_config(box: Box, spec: BoxSpec, opts: Options, image: ResolvedImage | None = None,
                run_user: RunUser | None = None, *, tools: str | None = None) -> dict[str, Any]:
    """What the guest reads once on port 1026 (docs/design.md §5)."""
    # Lowest first: tkbox's defaults, the image's Env, the doors' variables, --env
    # (tkbox.image.runconfig says why).
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "HOME": run_user.home if run_user else "/root", "LANG": "C.UTF-8",
           "TERM": "dumb",
           # Bytecode caches are files nobody commits; without this, running the
           # tests in the box put __pycache__/*.pyc into the patch and the checkout.
           "PYTHONDONTWRITEBYTECODE": "1"}
    config = image.config if image is not None else None
    if config is not None:
        env.update(image_env(config.env))
    env.update({"HTTP_PROXY": PROXY_URL, "HTTPS_PROXY": PROXY_URL, "http_proxy": PROXY_URL,
                "https_proxy": PROXY_URL, "NO_PROXY": "", "no_proxy": ""})
    pems = list(opts.ca_certs)
    if box.door is not None and box.door.ca_pem:
        pems.insert(0, box.door.ca_pem)
    if pems:
        bundle = "/etc/ssl/certs/ca-certificates.crt"
        env.update({"SSL_CERT_FILE": bundle, "REQUESTS_CA_BUNDLE": bundle,
                    "CURL_CA_BUNDLE": bundle, "PIP_CERT": bundle, "GIT_SSL_CAINFO": bundle,
                    "NODE_EXTRA_CA_CERTS": "/etc/ssl/certs/tkbox-ca.pem"})
    if tools is not None:
        # the agent's program first on PATH (a --env PATH still wins: it is the user's)
        env["PATH"] = f"{tools}/bin:{env['PATH']}"
    env.update(spec.env)
    for sec in box.secrets:
        env[sec.name] = sec.placeholder.decode("ascii")
    host = spec.name + ("-unrecorded" if opts.unrecorded else "")
    # seed: host randomness the guest credits to its kernel and reseeds from
    # before anything else (a box restored from a template needs its own).
    disks = {"root": "root", "lower": "lower", "upper": "upper"}
    cfg = {"v": 1, "time": time.time(), "seed": os.urandom(64), "hostname": host[:63],
           "env": env,
           "ca_pems": pems, "disks": disks,
           "tmpfs_size": f"{max(64, spec.memory_mib // 2)}m"}
    if run_user is not None:
        cfg["user"] = {"uid": run_user.uid, "gid": run_user.gid,
                       "groups": list(run_user.groups)}
    if spec.workspace_owner is not None:
        cfg["workspace_owner"] = list(spec.workspace_owner)
    if tools is not None:
        cfg["disks"] = {**disks, "tools": "tools"}
        cfg["tools_mount"] = tools
    return cfg


def boot_answer_ok(msg: dict[str, Any]) -> bool:
    """The guest's one answer on port 1026: `ready` (uptime) or `error` (message), nothing else."""
    allowed = {"ready": {"uptime"}, "error": {"message"}}.get(msg.get("ev"))  # type: ignore[arg-type]
    return allowed is not None and set(msg) - {"ev"} <= allowed


def image_user(image: ResolvedImage) -> RunUser | None:
    """The user the image names, resolved against its own root disk (None: root)."""
    config = image.config
    if config is None or not config.user:
        return None
    return user_of(Path(image.rootfs), config.user)


def image_config_facts(image: ResolvedImage, run_user: RunUser | None) -> dict[str, Any]:
    """What of the image's config the box applied, for its run's open record."""
    config = image.config
    if config is None:
        return {}
    return {"env_names": recorded_names(image_env(config.env)), "user": config.user[:256],
            "run_as": run_user.to_json() if run_user else None,
            "working_dir": config.working_dir[:4096]}
