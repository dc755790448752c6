"""Credential files: never copied into a box's workspace, and never scanned for a
secret's value before it starts (they are not copied, so they cannot leak).

One list, used by the daemon's workspace copy (`tkbox.daemon.workspace`) and by
the secrets door's pre-start check (`prestart.check_workspace`). It lives with
the secrets door, below the daemon, so that the door needs nothing of the daemon.
"""

from __future__ import annotations

import fnmatch

#: names of credential files, matched against each path component's name
CREDENTIAL_NAMES = (
    ".env", ".env.*", "*.env", ".envrc", "*.pem", "*.key", "*.p12", "*.pfx", "*.jks",
    "*.keystore", ".netrc", "_netrc", ".npmrc", ".yarnrc", ".yarnrc.yml", ".pypirc",
    ".pgpass", ".git-credentials", "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*",
    ".htpasswd", "credentials", "credentials.json", "*.kubeconfig", "kubeconfig",
    ".vault-token", "terraform.tfstate*", "*.tfvars", "secrets.y*ml", ".boto", ".s3cfg",
)
#: directories never copied (their whole subtree)
CREDENTIAL_DIRS = (".ssh", ".aws", ".gnupg", ".kube", ".azure", ".gcloud")
#: exact relative paths never copied
CREDENTIAL_PATHS = (".docker/config.json", ".config/gcloud", ".config/gh/hosts.yml",
                    ".git/hooks", ".git/credentials")


def is_credential(rel: str, is_dir: bool) -> bool:
    parts = rel.split("/")
    lower = [p.lower() for p in parts]
    if is_dir and lower[-1] in CREDENTIAL_DIRS:
        return True
    for p in CREDENTIAL_PATHS:
        if rel == p or rel.startswith(p + "/"):
            return True
    if not is_dir:
        name = lower[-1]
        if any(fnmatch.fnmatchcase(name, pat) for pat in CREDENTIAL_NAMES):
            # `.env.example` and friends carry no secrets by convention.
            if name.endswith((".example", ".sample", ".template", ".dist")):
                return False
            return True
    return False
