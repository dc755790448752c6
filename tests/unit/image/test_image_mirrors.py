"""The mirror settings, as pure functions: URLs, flags, hosts.toml, daemon.json, and which
endpoints a pull asks, in what order. Properties are checked against generated input."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tkbox.errors import UserError
from tkbox.image.mirrors import (
    HostsConfig,
    Registries,
    Settings,
    candidates,
    host_dir_registry,
    parse_daemon_json,
    parse_hosts_toml,
    parse_mirror_flag,
    parse_url,
)

FAST = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
BASE = Path("/etc/containerd/certs.d/docker.io")
WHERE = "certs.d/docker.io/hosts.toml"


def hosts(text: str) -> HostsConfig:
    return parse_hosts_toml(text, base=BASE, where=WHERE)


def urls(table: Registries, registry: str) -> list[tuple[str, bool]]:
    return [(e.url, e.mirror) for e in table.endpoints(registry)]


# --- URLs: containerd's API root ------------------------------------------------------------


@pytest.mark.parametrize("url, override, expected", [
    ("https://mirror.internal", False, ("https://mirror.internal", "/v2")),
    ("https://mirror.internal/", False, ("https://mirror.internal", "/v2")),
    ("https://mirror.internal/v2", False, ("https://mirror.internal", "/v2")),
    ("https://mirror.internal/v2/", False, ("https://mirror.internal", "/v2")),
    ("mirror.internal:5000", False, ("https://mirror.internal:5000", "/v2")),
    ("HTTPS://Mirror.Internal", False, ("https://mirror.internal", "/v2")),
    ("https://proxy/docker-hub", False, ("https://proxy", "/docker-hub/v2")),
    ("https://proxy/artifactory/api/docker/hub/v2", False,
     ("https://proxy", "/artifactory/api/docker/hub/v2")),
    ("https://harbor/v2/hub-proxy", True, ("https://harbor", "/v2/hub-proxy")),
    ("https://harbor", True, ("https://harbor", "")),
    ("https://[::1]:5000", False, ("https://[::1]:5000", "/v2")),
])
def test_api_root_as_containerd_computes_it(url: str, override: bool,
                                            expected: tuple[str, str]) -> None:
    assert parse_url(url, override_path=override, what="t") == expected


@pytest.mark.parametrize("url, why", [
    ("http://mirror.internal", "plain http; tkbox speaks to registries and mirrors over HTTPS"),
    ("ftp://mirror.internal", "is not an https URL"),
    ("https://mirror.internal?x=1", "query or fragment"),
    ("https://mirror.internal/a#b", "query or fragment"),
    ("https://mirror.internal/a//b", "not canonical"),
    ("https://mirror.internal/a/../b", "not canonical"),
    ("https://mirror.internal/a%2fb", "not canonical"),
    ("https://mirror.internal/v2/hub-proxy", "override_path = true"),
    ("https://mirror internal", "spaces"),
    ("https://mirror.internal:0", "malformed registry port"),
    ("https://-bad-.internal", "malformed registry host"),
    ("https://", "1 to 300 characters"),
    ("", "non-empty"),
])
def test_urls_tkbox_refuses(url: str, why: str) -> None:
    with pytest.raises(UserError, match=why):
        parse_url(url, what="--registry-mirror docker.io=…")


def test_a_url_with_credentials_is_refused_without_showing_them() -> None:
    with pytest.raises(UserError) as e:
        parse_url("https://bob:hunter2@mirror.internal", what="t")
    assert "hunter2" not in str(e.value) and "bob" not in str(e.value)
    assert "holds credentials" in str(e.value)


# --- --registry-mirror ------------------------------------------------------------------------


def test_mirror_flag_names_the_registry_as_references_do() -> None:
    for written in ("docker.io", "index.docker.io", "registry-1.docker.io", "Docker.IO"):
        registry, e = parse_mirror_flag(f"{written}=https://mirror.internal")
        assert registry == "docker.io" and e.url == "https://mirror.internal/v2"
    registry, e = parse_mirror_flag("ghcr.io=https://proxy/ghcr")
    assert (registry, e.url) == ("ghcr.io", "https://proxy/ghcr/v2")
    assert parse_mirror_flag("localhost:5000=https://m")[0] == "localhost:5000"


@pytest.mark.parametrize("flag", ["docker.io", "=https://m", "docker.io=", "bad host=https://m",
                                  "docker.io=http://m", "a..b=https://m"])
def test_malformed_mirror_flags(flag: str) -> None:
    with pytest.raises(UserError, match="--registry-mirror"):
        parse_mirror_flag(flag)


# --- hosts.toml -------------------------------------------------------------------------------


CONTAINERD_EXAMPLE = """\
server = "https://registry-1.docker.io"

[host."https://mirror-b.internal"]
  capabilities = ["pull"]

[host."https://mirror-a.internal/docker-hub"]
  capabilities = ["pull", "resolve"]
  ca = ["/etc/certs/a.pem", "rel.pem"]
  skip_verify = false
"""


def test_hosts_toml_keeps_the_files_order_and_its_options() -> None:
    c = hosts(CONTAINERD_EXAMPLE)
    assert [e.url for e in c.hosts] == ["https://mirror-b.internal/v2",
                                        "https://mirror-a.internal/docker-hub/v2"]
    b, a = c.hosts
    assert (b.pull, b.resolve) == (True, False) and (a.pull, a.resolve) == (True, True)
    assert a.ca == ("/etc/certs/a.pem", str(BASE / "rel.pem"))  # relative: to the file's dir
    assert c.server is not None and c.server.url == "https://registry-1.docker.io/v2"
    assert all(e.where == WHERE for e in (*c.hosts, c.server))


def test_top_level_options_apply_to_the_registry_itself() -> None:
    c = hosts('capabilities = ["pull"]\nca = "top.pem"\n[host."https://m"]\n')
    own = c.endpoints("ghcr.io")[-1]
    assert own.url == "https://ghcr.io/v2" and (own.pull, own.resolve) == (True, False)
    assert own.ca == (str(BASE / "top.pem"),)
    assert c.endpoints("docker.io")[-1].url == "https://registry-1.docker.io/v2"


@pytest.mark.parametrize("text, why", [
    ('[host."https://m"]\nskip_verify = true\n', "tkbox does not skip TLS checks"),
    ('skip_verify = true\n', "tkbox does not skip TLS checks"),
    ('[host."https://m"]\nskip_verify = "no"\n', "skip_verify must be true or false"),
    ('[host."https://m"]\nclient = "c.pem"\n', "client certificates are not supported"),
    ('[host."https://m".header]\nAuthorization = "Basic eA=="\n', "headers are not sent"),
    ('[host."https://m"]\ndial_timeout = "3s"\n', "dial_timeout is not read"),
    ('[host."https://m"]\ncapabilities = ["pull", "fly"]\n', "unknown capability 'fly'"),
    ('[host."https://m"]\ncapabilities = []\n', "name them"),
    ('[host."https://m"]\ncapabilities = "pull"\n', "must be a list of strings"),
    ('[host."https://m"]\nca = 3\n', "ca must be a path"),
    ('[host."https://m"]\nca = []\n', "ca must be a path"),
    ('[host."https://m"]\noverride_path = 1\n', "override_path must be true or false"),
    ('[host."https://m"]\nmirror = true\n', "unknown key 'mirror'"),
    ('whatever = 1\n', "unknown key 'whatever'"),
    ('host = "https://m"\n', "host must be tables"),
    ('server = 5\n', "a URL must be a non-empty string"),
    ('server = "http://registry"\n', "plain http"),
    ('[host."http://m"]\n', "plain http"),
    ('[host."https://u:p@m"]\n', "holds credentials"),
    ('[host\n', "is not valid TOML"),
    ('[host."https://m"]\n[host."https://m"]\n', "is not valid TOML"),
    ("".join(f'[host."https://m{i}"]\n' for i in range(17)), "more than 16 hosts"),
])
def test_hosts_toml_refusals_name_the_file(text: str, why: str) -> None:
    with pytest.raises(UserError, match=why) as e:
        hosts(text)
    assert str(e.value).startswith(WHERE)


def test_hosts_toml_never_echoes_header_values() -> None:
    with pytest.raises(UserError) as e:
        hosts('[host."https://m".header]\nAuthorization = "Bearer sekrit-value"\n')
    assert "sekrit" not in str(e.value)


def test_host_directory_names() -> None:
    assert host_dir_registry("docker.io") == "docker.io"
    assert host_dir_registry("127.0.0.1_5000_") == "127.0.0.1:5000"
    assert host_dir_registry("registry.internal:5000") == "registry.internal:5000"
    assert host_dir_registry("[::1]_5000_") == "[::1]:5000"
    for bad in ("not a host", "x_y", ".git", "a_99999_"):
        with pytest.raises(UserError):
            host_dir_registry(bad)


# --- daemon.json --------------------------------------------------------------------------


def test_daemon_json_mirrors_only_its_registry_mirrors() -> None:
    data = json.dumps({"registry-mirrors": ["https://a.internal", "https://b.internal/hub"],
                       "insecure-registries": ["x:5000"], "debug": True}).encode()
    assert [e.url for e in parse_daemon_json(data, where="daemon.json")] == [
        "https://a.internal/v2", "https://b.internal/hub/v2"]
    assert parse_daemon_json(b"{}", where="daemon.json") == ()
    for bad, why in ((b"[]", "not a JSON object"), (b"{", "not JSON"),
                     (b'{"registry-mirrors": "https://a"}', "must be a list"),
                     (b'{"registry-mirrors": ["http://a"]}', "plain http"),
                     (b"[" * 100000, "not JSON")):
        with pytest.raises(UserError, match=why):
            parse_daemon_json(bad, where="daemon.json")


# --- the table: which endpoints, in what order ------------------------------------------------


def test_flags_give_mirrors_in_order_then_the_registry() -> None:
    t = Registries.parse(Settings(("docker.io=https://a", "index.docker.io=https://b/hub")))
    assert urls(t, "docker.io") == [("https://a/v2", True), ("https://b/hub/v2", True),
                                    ("https://registry-1.docker.io/v2", False)]
    assert urls(t, "ghcr.io") == [("https://ghcr.io/v2", False)]  # no mirror: itself


def test_mirror_only_leaves_out_registries_that_have_mirrors() -> None:
    t = Registries.parse(Settings(("docker.io=https://a",), mirror_only=True))
    assert urls(t, "docker.io") == [("https://a/v2", True)]
    assert urls(t, "ghcr.io") == [("https://ghcr.io/v2", False)]


def test_a_mirror_named_twice_or_configured_twice_is_refused() -> None:
    with pytest.raises(UserError, match="given twice"):
        Registries.parse(Settings(("docker.io=https://a", "docker.io=https://a/v2")))
    with pytest.raises(UserError, match="configured twice"):
        Registries.parse(Settings(("docker.io=https://a",)), {"docker.io": hosts("")})
    with pytest.raises(UserError, match="needs a mirror"):
        Registries.parse(Settings(mirror_only=True))
    with pytest.raises(UserError, match="more than 16 mirrors"):
        Registries.parse(Settings(tuple(f"docker.io=https://m{i}" for i in range(17))))


def test_hosts_directory_precedence_and_default() -> None:
    t = Registries.parse(Settings(("docker.io=https://flag",)), {
        "ghcr.io": hosts('[host."https://ghcr-mirror"]\n'),
        "_default": hosts('[host."https://everything"]\n'),
    })
    assert urls(t, "docker.io")[0] == ("https://flag/v2", True)  # the flag, not _default
    assert urls(t, "ghcr.io") == [("https://ghcr-mirror/v2", True),
                                  ("https://ghcr.io/v2", False)]
    assert urls(t, "quay.io") == [("https://everything/v2", True), ("https://quay.io/v2", False)]


def test_a_server_that_is_another_host_is_a_mirror_and_mirror_only_keeps_it() -> None:
    t = Registries.parse(Settings(mirror_only=True),
                         {"docker.io": hosts('server = "https://only-mirror"\n')})
    assert urls(t, "docker.io") == [("https://only-mirror/v2", True)]
    t = Registries.parse(Settings(), {"docker.io": hosts(
        'server = "https://registry-1.docker.io"\n[host."https://registry-1.docker.io"]\n')})
    assert urls(t, "docker.io") == [("https://registry-1.docker.io/v2", False)]  # asked once


def test_capabilities_decide_who_answers_a_tag_and_who_a_digest() -> None:
    t = Registries.parse(Settings(), {"docker.io": hosts(
        '[host."https://pull-only"]\ncapabilities = ["pull"]\n'
        '[host."https://resolver"]\ncapabilities = ["resolve", "pull"]\n'
        '[host."https://push-only"]\ncapabilities = ["push"]\n')})
    eps = t.endpoints("docker.io")
    assert [eps[i].url for i in candidates(eps, by_digest=False)] == [
        "https://resolver/v2", "https://registry-1.docker.io/v2"]
    assert [eps[i].url for i in candidates(eps, by_digest=True)] == [
        "https://pull-only/v2", "https://resolver/v2", "https://registry-1.docker.io/v2"]


def test_settings_travel_through_the_daemons_info() -> None:
    s = Settings(("docker.io=https://a",), True, "/etc/containerd/certs.d")
    assert Settings.from_json(json.loads(json.dumps(s.to_json()))) == s
    assert Settings.from_json(None) == Settings()
    for bad in ([], {"mirrors": "x"}, {"mirrors": [1]}, {"mirror_only": "yes"},
                {"config": ""}, {"mirrors": ["x"] * 1000}):
        with pytest.raises(UserError, match="malformed"):
            Settings.from_json(bad)


# --- properties -----------------------------------------------------------------------------

url_chars = st.sampled_from(list(string.ascii_letters + string.digits + ":/.@?#%[]-_ ~")
                            + ["https://", "http://", "v2", "/v2", "..", "//"])
any_url = st.one_of(st.text(max_size=80), st.lists(url_chars, max_size=30).map("".join))


@FAST
@given(any_url, st.booleans())
def test_any_url_is_an_https_endpoint_or_a_user_error(text: str, override: bool) -> None:
    try:
        origin, root = parse_url(text, override_path=override, what="t")
    except UserError as e:
        assert "\n" not in str(e)
        return
    assert origin.startswith("https://") and "/" not in origin[len("https://"):]
    assert "@" not in origin and "?" not in root and "#" not in root
    assert root == "" or root.startswith("/")
    assert "//" not in root and "/../" not in root + "/" and "/./" not in root + "/"
    if not override:
        assert root.endswith("/v2") and "/v2/" not in root
    # the endpoint parses back to itself: one canonical form
    assert parse_url(origin + root, override_path=True, what="t") == (origin, root)


@FAST
@given(st.one_of(st.text(max_size=80),
                 st.tuples(st.sampled_from(["docker.io", "ghcr.io", "x:1", "", "a b"]),
                           any_url).map(lambda t: f"{t[0]}={t[1]}")))
def test_any_flag_is_a_mirror_or_a_user_error(text: str) -> None:
    try:
        registry, e = parse_mirror_flag(text)
    except UserError:
        return
    assert registry == registry.lower() and e.origin.startswith("https://")


toml_value = st.recursive(
    st.one_of(st.booleans(), st.integers(), st.text(max_size=20),
              st.sampled_from(["pull", "resolve", "push", "https://m", "http://m", "ca.pem"])),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from(
                                ["capabilities", "ca", "skip_verify", "override_path",
                                 "client", "header", "x"]), inner, max_size=3)),
    max_leaves=10)


def _toml(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, str)):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    assert isinstance(v, dict)
    return "{" + ", ".join(f"{json.dumps(k)} = {_toml(x)}" for k, x in v.items()) + "}"


@FAST
@given(st.one_of(
    st.text(max_size=200),
    st.dictionaries(st.sampled_from(["server", "capabilities", "ca", "skip_verify",
                                     "override_path", "host", "dial_timeout", "y"]),
                    st.one_of(toml_value, st.dictionaries(
                        st.sampled_from(["https://a", "http://b", "c:5000", "https://u@d",
                                         "https://e/v2/x", ""]),
                        toml_value, max_size=3)), max_size=4)
    .map(lambda d: "\n".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in d.items()))))
def test_any_hosts_toml_is_a_config_or_a_one_line_user_error(text: str) -> None:
    try:
        c = hosts(text)
    except UserError as e:
        assert "\n" not in str(e) and str(e).startswith(WHERE)
        return
    for e in c.endpoints("docker.io"):
        assert e.origin.startswith("https://") and e.where == WHERE
        assert len(e.ca) <= 16


@FAST
@given(st.one_of(st.binary(max_size=200), st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from(["registry-mirrors", "x"]), inner,
                                            max_size=2)),
    max_leaves=8).map(lambda v: json.dumps(v).encode())))
def test_any_daemon_json_is_mirrors_or_a_user_error(data: bytes) -> None:
    try:
        eps = parse_daemon_json(data, where="daemon.json")
    except UserError:
        return
    assert all(e.origin.startswith("https://") for e in eps)


registries_st = st.sampled_from(["docker.io", "ghcr.io", "127.0.0.1:5000", "[::1]:5000"])


@FAST
@given(st.lists(st.tuples(registries_st, st.sampled_from(
    ["https://a", "https://b/hub", "https://registry-1.docker.io", "https://ghcr.io/v2",
     "https://127.0.0.1:5000"])), max_size=6, unique=True),
    st.booleans(), registries_st)
def test_resolution_rules_hold_for_any_flags(flags: list[tuple[str, str]], only: bool,
                                              registry: str) -> None:
    """Mirrors first in the order given; the registry itself last, unless mirror-only left
    it out; never an endpoint twice; a mirror is exactly an endpoint not on the registry's
    own host."""
    try:
        t = Registries.parse(Settings(tuple(f"{r}={u}" for r, u in flags), only))
    except UserError:
        assert only and not flags or len({(r, parse_url(u, what="t")) for r, u in flags}) \
            < len(flags)
        return
    eps = t.endpoints(registry)
    assert eps and len({e.url for e in eps}) == len(eps)
    own_host = "registry-1.docker.io" if registry == "docker.io" else registry
    own = f"https://{own_host}/v2"
    given_urls = [parse_url(u, what="t") for r, u in flags if r == registry]
    given_urls = list(dict.fromkeys(o + r for o, r in given_urls))
    mirrors = [u for u in given_urls if u != own and not (
        registry == "docker.io" and u.startswith("https://docker.io/"))]
    for e in eps:
        assert e.mirror == (e.url != own)
    if only and mirrors:
        assert [e.url for e in eps] == mirrors
    else:
        assert [e.url for e in eps] == list(dict.fromkeys([*given_urls, own]))


def test_the_daemon_describes_its_table_in_one_line_a_registry() -> None:
    t = Registries.parse(Settings(("docker.io=https://a",)),
                         {"_default": hosts('[host."https://everything"]\n')})
    assert t.describe() == [
        "any other registry: mirror https://everything/v2, then the registry itself",
        "docker.io: mirror https://a/v2, then registry https://registry-1.docker.io/v2"]
    assert Registries.parse(Settings()).describe() == []


def test_a_mirror_flag_never_echoes_credentials() -> None:
    with pytest.raises(UserError) as e:
        parse_mirror_flag("docker.io=https://bob:hunter2@mirror.internal")
    assert "hunter2" not in str(e.value)
