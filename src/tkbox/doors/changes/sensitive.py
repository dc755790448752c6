"""Which changes are held back unless the person says `--allow-sensitive` (pure).

A file is sensitive when changing it alters what runs *without anyone running
the changed code on purpose*: CI and its secrets, git's own behaviour, hooks,
the next box's configuration, a shell's or editor's automatic actions, where
dependencies come from, or credentials. Ordinary source, build files
included (`Makefile`, `package.json`, `setup.py`), is not: it runs only when
the person runs it, after reading the diff; holding every build file back
would hold back most patches and teach people to pass `--allow-sensitive`
blindly. The full list, with reasons, is in docs/changes.md.

Rules are matched on folded components (`paths.fold_ntfs`: NFKC, case
folded, trailing dots and spaces cut), so `.GitHub/Workflows/ci.yml` and
`.ENVRC` are caught, at any depth (a nested project has its own CI too), and
a directory rule holds back the name itself whatever its type. The door
applies these rules to every name the final tree reaches a path by
(`links.FinalTree.aliases`), and adds the files the checkout's git
configuration names (`gitnamed`).

Also held back: making a file executable (a new file with mode 100755, or a
mode change to it), since an executable file is what hooks, CI and `PATH`
lookups run.
"""

from __future__ import annotations

import fnmatch
import re

from tkbox.doors.changes.paths import folded_parts

# (folded directory components, reason): the file is below these, at any depth
_DIRS: tuple[tuple[tuple[str, ...], str], ...] = (
    ((".github", "workflows"), "GitHub Actions workflow"),
    ((".github", "actions"), "GitHub Actions action used by workflows"),
    ((".gitea", "workflows"), "Gitea Actions workflow"),
    ((".forgejo", "workflows"), "Forgejo Actions workflow"),
    ((".gitlab",), "GitLab CI configuration"),
    ((".circleci",), "CircleCI configuration"),
    ((".buildkite",), "Buildkite pipeline"),
    ((".azure-pipelines",), "Azure Pipelines configuration"),
    ((".semaphore",), "Semaphore CI configuration"),
    ((".teamcity",), "TeamCity configuration"),
    ((".woodpecker",), "Woodpecker CI pipeline"),
    ((".husky",), "git hooks (husky)"),
    ((".githooks",), "git hooks directory"),
    ((".devcontainer",), "dev container definition (runs commands on open)"),
    ((".vscode",), "editor configuration (tasks can run on folder open)"),
    ((".idea",), "editor configuration (run configurations, startup tasks)"),
    ((".tkbox",), "tkbox configuration"),
    ((".ssh",), "SSH keys and configuration"),
    ((".aws",), "cloud credentials"),
    ((".gnupg",), "GnuPG keys"),
    ((".kube",), "Kubernetes credentials"),
    ((".cargo",), "Cargo configuration (registries, credentials)"),
    ((".pip",), "pip configuration (package index)"),
    ((".bundle",), "Bundler configuration (gem sources)"),
    ((".m2",), "Maven configuration (repositories, credentials)"),
)

# (glob on the folded file name, reason), at any depth
_NAMES: tuple[tuple[str, str], ...] = (
    (".gitignore", "git ignore rules (decide what review sees)"),
    (".gitattributes", "git attributes (filters, diff and merge drivers)"),
    (".gitmodules", "git submodules"),
    (".gitconfig", "git configuration"),
    (".lfsconfig", "git LFS configuration"),
    ("codeowners", "code owners (review rules)"),
    ("tkbox.yaml", "tkbox configuration (the next box's allowlist, secrets, limits)"),
    ("tkbox.yml", "tkbox configuration (the next box's allowlist, secrets, limits)"),
    (".envrc", "direnv script (runs on cd)"),
    ("mise.toml", "mise configuration (environment, tasks on cd)"),
    (".mise.toml", "mise configuration (environment, tasks on cd)"),
    (".pre-commit-config.yaml", "git hooks (pre-commit)"),
    ("lefthook.yml", "git hooks (lefthook)"),
    (".lefthook.yml", "git hooks (lefthook)"),
    ("lefthook.yaml", "git hooks (lefthook)"),
    (".devcontainer.json", "dev container definition (runs commands on open)"),
    (".gitlab-ci.yml", "GitLab CI configuration"),
    (".travis.yml", "Travis CI configuration"),
    ("jenkinsfile", "Jenkins pipeline"),
    ("jenkinsfile.*", "Jenkins pipeline"),
    ("azure-pipelines*.yml", "Azure Pipelines configuration"),
    ("azure-pipelines*.yaml", "Azure Pipelines configuration"),
    ("bitbucket-pipelines.yml", "Bitbucket Pipelines configuration"),
    (".drone.yml", "Drone CI configuration"),
    (".woodpecker.yml", "Woodpecker CI pipeline"),
    ("appveyor.yml", "AppVeyor configuration"),
    (".appveyor.yml", "AppVeyor configuration"),
    (".cirrus.yml", "Cirrus CI configuration"),
    ("cloudbuild.yaml", "Google Cloud Build configuration"),
    ("cloudbuild.yml", "Google Cloud Build configuration"),
    ("buildspec.yml", "AWS CodeBuild configuration"),
    ("codefresh.yml", "Codefresh pipeline"),
    (".env", "environment file (credentials)"),
    (".env.*", "environment file (credentials)"),
    ("*.pem", "key or certificate"),
    ("*.key", "private key"),
    ("*.p12", "key store"),
    ("*.pfx", "key store"),
    ("*.jks", "key store"),
    ("*.keystore", "key store"),
    ("*.kdbx", "password database"),
    ("*.tfvars", "Terraform variables (often credentials)"),
    ("*.tfstate", "Terraform state (holds credentials)"),
    ("id_rsa*", "SSH key"),
    ("id_dsa*", "SSH key"),
    ("id_ecdsa*", "SSH key"),
    ("id_ed25519*", "SSH key"),
    (".netrc", "credentials (netrc)"),
    ("_netrc", "credentials (netrc)"),
    (".git-credentials", "git credentials"),
    (".npmrc", "npm configuration (registry, tokens)"),
    (".yarnrc", "Yarn configuration (registry, tokens)"),
    (".yarnrc.yml", "Yarn configuration (registry, tokens)"),
    (".pypirc", "PyPI credentials"),
    ("pip.conf", "pip configuration (package index)"),
    (".gemrc", "RubyGems configuration (sources)"),
    ("nuget.config", "NuGet configuration (feeds, credentials)"),
    (".terraformrc", "Terraform CLI configuration (credentials)"),
    (".htpasswd", "password file"),
    (".pgpass", "PostgreSQL passwords"),
    (".my.cnf", "MySQL credentials"),
    (".vault-token", "Vault token"),
    (".s3cfg", "S3 credentials"),
    (".boto", "cloud credentials"),
    (".dockercfg", "Docker registry credentials"),
    ("credentials.json", "credentials"),
    ("service-account*.json", "cloud service account key"),
)

_PAIRS: tuple[tuple[tuple[str, ...], str], ...] = (
    ((".docker", "config.json"), "Docker registry credentials"),
)


# Every _NAMES glob as one regex, alternatives in list order (the first that matches
# wins, as in a loop over the list), each in its own group to find its reason.
_NAMES_RE = re.compile("|".join(f"(?P<n{i}>{fnmatch.translate(pattern)})"
                                for i, (pattern, _) in enumerate(_NAMES)))
# A path none of whose components starts a _DIRS or _PAIRS rule matches none of them.
_FIRSTS = frozenset(prefix[0] for prefix, _ in _DIRS + _PAIRS)


def sensitive_reason(path: str) -> str | None:
    """Why `path` is sensitive, or None. `path` has passed `check_path`.

    A directory rule matches the path itself as well as what is below it,
    and so does a path that ends on the start of a rule: `.vscode`,
    `.github` and `.github/workflows` are held back whatever they are (a
    file, or a symlink to an ordinary directory, which tools then read as
    `.vscode` or `.github/workflows`), while `.github/ISSUE_TEMPLATE/x.md`
    is not.
    """
    parts = folded_parts(path)
    if not _FIRSTS.isdisjoint(parts):
        why = _dir_reason(parts)
        if why is not None:
            return why
    name = parts[-1]
    m = _NAMES_RE.match(name)
    if m is not None and m.lastgroup is not None:
        return _NAMES[int(m.lastgroup[1:])][1]
    for pair, why in _PAIRS:
        if parts[-len(pair):] == pair:
            return why
    return None


def _dir_reason(parts: tuple[str, ...]) -> str | None:
    for prefix, why in _DIRS:
        n = len(prefix)
        if any(parts[i : i + n] == prefix for i in range(len(parts) - n + 1)):
            return why
        if any(parts[len(parts) - k :] == prefix[:k] for k in range(1, n)):
            return f"{why}: a name on the way there"
    for pair, why in _PAIRS:
        if any(parts[len(parts) - k :] == pair[:k] for k in range(1, len(pair))):
            return f"{why}: a name on the way there"
    return None


def rules() -> list[tuple[str, str]]:
    """Every rule as (pattern, reason), for the documentation and `--help`."""
    out = [("/".join(p) + "/**", why) for p, why in _DIRS]
    out += [("**/" + n, why) for n, why in _NAMES]
    out += [("**/" + "/".join(p), why) for p, why in _PAIRS]
    return out
