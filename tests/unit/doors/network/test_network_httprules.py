"""The request rules' matcher: its grammar, an attack suite, and properties against a
reference written apart from it (`httprules_reference`: origin models, regex matcher).

The attack suite names each trick an agent could use to make the door match one
request while the origin acts on another; each is refused, or matched as every
origin model would read it. The properties: whatever the matcher allows, no origin
model reads as something the rules refuse; and on plain targets the matcher and
the reference agree exactly.
"""

from __future__ import annotations

import ast
import inspect

import pytest
from httprules_reference import reference_verdict, views
from hypothesis import given, settings
from hypothesis import strategies as st

from tkbox.doors.network import httprules
from tkbox.doors.network.allowlist import Allowlist
from tkbox.doors.network.httprules import RuleError, RuleSet, parse_rules, split_entry
from tkbox.doors.network.presets import preset_entries
from tkbox.errors import UserError

API = ["GET HEAD /**", "POST /repos/acme/app/pulls", "ask DELETE /repos/acme/*/git/refs/**",
       "refuse * /admin/**"]
GIT = ["GET /*/*/info/refs?service=git-upload-pack", "POST /*/*/git-upload-pack"]


def rs(rules: list[str], host: str = "api.test") -> RuleSet:
    return RuleSet(host, parse_rules("; ".join(rules)))


def verdict(rules: list[str], method: bytes, target: bytes,
            headers: list[tuple[bytes, bytes]] | None = None) -> str:
    return rs(rules).decide_raw(method, target, headers or []).action


# --- grammar --------------------------------------------------------------------


def test_an_entry_with_rules_is_never_read_as_host_and_port() -> None:
    assert split_entry("api.test:8443 GET /x") == ("api.test:8443", "GET /x")
    assert split_entry("api.test:8443") == ("api.test:8443", None)
    a = Allowlist(["api.test GET HEAD /**; ask DELETE /x", "api.test:8443"],
                  expand=lambda n: None)
    r = a.rules_for("api.test", 443)
    assert r is not None and r.text == "GET HEAD /**; ask DELETE /x"
    assert a.rules_for("api.test", 8443) is None  # only the unruled entry names 8443
    assert a.ruled_names() == {"api.test"}


@pytest.mark.parametrize("text,why", [
    ("get /x", "not a method"),
    ("GET x", "must begin with /"),
    ("GET /a*", "stands alone"),
    ("GET /a/**b", "stands alone"),
    ("GET /a/../b", "dot segments"),
    ("GET /a%2Fb", "without # ? %"),
    ("GET /x?a", "key=value"),
    ("GET /x?a=1&a=2", "twice"),
    ("ALLOW GET /x", "lower case"),
    ("GET", "a rule is"),
    ("GET /x;; POST /y", "empty rule"),
])
def test_rules_that_do_not_parse_say_what_to_fix(text: str, why: str) -> None:
    with pytest.raises(RuleError) as e:
        parse_rules(text)
    assert why in e.value.message


def test_a_bad_rule_in_an_allow_entry_is_a_one_line_user_error() -> None:
    with pytest.raises(UserError) as e:
        Allowlist(["api.test GET /a*"], expand=lambda n: None)
    assert "api.test GET /a*" in e.value.message and "\n" not in e.value.message
    with pytest.raises(UserError, match="not an IP address"):
        Allowlist(["10.0.0.1:443 GET /x"], expand=lambda n: None)


def test_github_read_is_git_upload_pack_and_api_gets_only() -> None:
    a = Allowlist(["github-read"])
    web = a.rules_for("github.com", 443)
    api = a.rules_for("api.github.com", 443)
    assert web is not None and api is not None
    refs = b"/acme/app.git/info/refs?service=git-upload-pack"
    assert web.decide_raw(b"GET", refs, []).action == "allow"
    assert web.decide_raw(b"POST", b"/acme/app.git/git-upload-pack", []).action == "allow"
    push = web.decide_raw(b"GET", b"/acme/app.git/info/refs?service=git-receive-pack", [])
    assert push.action == "refuse" and "no rule of github.com allows" in push.reason
    assert web.decide_raw(b"POST", b"/acme/app.git/git-receive-pack", []).action == "refuse"
    assert api.decide_raw(b"GET", b"/repos/acme/app/pulls?state=open", []).action == "allow"
    for method in (b"POST", b"PATCH", b"PUT", b"DELETE"):
        assert api.decide_raw(method, b"/repos/acme/app", []).action == "refuse"
    assert a.rules_for("uploads.github.com", 443) is None
    aimed = preset_entries("github-read@git.test:8443")
    assert aimed is not None and aimed[0].startswith("git.test:8443 GET /*/*/info/refs")
    b = Allowlist(["github-read@git.test:8443"])
    r = b.rules_for("git.test", 8443)
    assert r is not None and r.decide_raw(b"GET", b"/api/v3/user", []).action == "allow"


# --- the attack suite -------------------------------------------------------------


@pytest.mark.parametrize("method,target,headers,expected", [
    # the rules as written
    (b"GET", b"/repos/acme/app", [], "allow"),
    (b"POST", b"/repos/acme/app/pulls", [], "allow"),
    (b"DELETE", b"/repos/acme/app/git/refs/heads/x", [], "ask"),
    (b"DELETE", b"/repos/acme/app", [], "refuse"),
    (b"POST", b"/repos/acme/app/issues", [], "refuse"),
    # a method in lower or mixed case
    (b"get", b"/repos/acme/app", [], "refuse"),
    (b"Delete", b"/repos/acme/app", [], "refuse"),
    # X-HTTP-Method-Override and its siblings, the _method parameter, a form POST
    (b"POST", b"/repos/acme/app/pulls", [(b"X-HTTP-Method-Override", b"DELETE")], "refuse"),
    (b"GET", b"/repos/acme/app", [(b"x-http-method", b"delete")], "refuse"),
    (b"GET", b"/repos/acme/app", [(b"X-Method-Override", b"PUT")], "refuse"),
    (b"GET", b"/repos/acme/app?_method=DELETE", [], "refuse"),
    (b"GET", b"/repos/acme/app?a=1;_method=DELETE", [], "refuse"),
    (b"POST", b"/repos/acme/app/pulls", [(b"Content-Type", b"application/x-www-form-urlencoded")],
     "refuse"),
    (b"POST", b"/repos/acme/app/pulls", [(b"content-type", b"multipart/form-data; b=x")],
     "refuse"),
    (b"POST", b"/repos/acme/app/pulls", [(b"content-type", b"application/json")], "allow"),
    # case
    (b"GET", b"/ADMIN/users", [], "refuse"),
    (b"GET", b"/Admin/users", [], "refuse"),
    (b"POST", b"/REPOS/acme/app/pulls", [], "refuse"),  # a case-sensitive origin: no rule
    # percent-encoding: unreserved characters, encoded slashes and backslashes
    (b"GET", b"/%61dmin/users", [], "refuse"),
    (b"GET", b"/x/..%2Fadmin", [], "refuse"),
    (b"GET", b"/x%2F..%2Fadmin", [], "refuse"),
    (b"GET", b"/x%2fadmin", [], "allow"),  # read as /x/admin too: still only GETs
    (b"POST", b"/repos%2Facme/app/pulls", [], "refuse"),
    (b"GET", b"/admin%5Cusers", [], "refuse"),
    (b"GET", b"/admin\\users", [], "refuse"),
    (b"GET", b"/%252e%252e/admin", [], "refuse"),
    (b"GET", b"/%2", [], "refuse"),
    (b"GET", b"/%zz", [], "refuse"),
    (b"GET", b"/%00/x", [], "refuse"),
    (b"GET", b"/%c0%af", [], "refuse"),  # an overlong /
    (b"GET", b"/%ef%bc%8fadmin/x", [], "refuse"),  # a fullwidth solidus
    # dot segments, literal and escaped
    (b"GET", b"/repos/../admin/x", [], "refuse"),
    (b"GET", b"/repos/./acme", [], "refuse"),
    (b"GET", b"/repos/%2e%2e/admin", [], "refuse"),
    (b"GET", b"/repos/.%2E/admin", [], "refuse"),
    (b"GET", b"/..;/admin", [], "refuse"),
    # duplicate and trailing slashes
    (b"GET", b"//admin/users", [], "refuse"),
    (b"GET", b"/admin//users", [], "refuse"),
    (b"POST", b"/repos/acme/app/pulls/", [], "refuse"),  # merged: allowed; as is: no rule
    (b"POST", b"//repos/acme/app/pulls", [], "refuse"),
    # ;params
    (b"GET", b"/admin;jsessionid=1/users", [], "refuse"),
    (b"POST", b"/repos/acme/app/pulls;x=1", [], "refuse"),
    # absolute-form, asterisk-form, fragments, odd bytes
    (b"GET", b"http://api.test/repos/acme/app", [], "refuse"),
    (b"GET", b"//api.test/admin", [], "refuse"),
    (b"OPTIONS", b"*", [], "refuse"),
    (b"GET", b"/repos#/admin", [], "refuse"),
    (b"GET", b"/repos/\xffx", [], "refuse"),
])
def test_attack_suite(method: bytes, target: bytes, headers: list[tuple[bytes, bytes]],
                      expected: str) -> None:
    got = rs(API).decide_raw(method, target, headers)
    assert got.action == expected, got.reason
    if expected == "refuse":
        assert got.reason.startswith("refused: ") and "api.test" in got.reason


@pytest.mark.parametrize("target,expected", [
    (b"/acme/app.git/info/refs?service=git-upload-pack", "allow"),
    (b"/acme/app/info/refs?service=git-upload-pack", "allow"),
    (b"/acme/app.git/info/refs?service=git-receive-pack", "refuse"),
    # a second service parameter: origins take the first or the last
    (b"/acme/app.git/info/refs?service=git-upload-pack&service=git-receive-pack", "refuse"),
    (b"/acme/app.git/info/refs?service=git-upload-pack;service=git-receive-pack", "refuse"),
    (b"/acme/app.git/info/refs?service=git-%75pload-pack", "allow"),
    (b"/acme/app.git/info/refs?service=git-receive%2Dpack", "refuse"),
    (b"/acme/app.git/info/refs?service=git-upload-pack&x=1", "refuse"),
    (b"/acme/app.git/info/refs", "refuse"),
])
def test_git_service_parameter_attacks(target: bytes, expected: str) -> None:
    assert rs(GIT).decide_raw(b"GET", target, []).action == expected


def test_the_most_restrictive_rule_wins_whatever_the_order() -> None:
    for rules in (["GET /**", "refuse GET /admin/**"], ["refuse GET /admin/**", "GET /**"]):
        assert verdict(rules, b"GET", b"/admin/x") == "refuse"
        assert verdict(rules, b"GET", b"/x") == "allow"
    assert verdict(["GET /**", "ask GET /x"], b"GET", b"/x") == "ask"


def test_refusals_name_the_rule_they_matched_or_missed() -> None:
    r = rs(API).decide_raw(b"GET", b"/admin/x", [])
    assert "matches the rule 'refuse * /admin/**'" in r.reason
    r = rs(API).decide_raw(b"DELETE", b"/repos/acme/app", [])
    assert "no rule of api.test allows DELETE /repos/acme/app" in r.reason
    assert "GET HEAD /**" in r.reason
    r = rs(API).decide_raw(b"GET", b"//admin/x", [])
    assert "read as /admin/x (empty segments merged)" in r.reason


def test_the_matcher_is_a_pure_core() -> None:
    """No I/O, no clock, no asyncio: its imports are the standard library's pure
    modules and tkbox.errors."""
    tree = ast.parse(inspect.getsource(httprules))
    mods = {n.module if isinstance(n, ast.ImportFrom) else a.name
            for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)
            for a in (n.names if isinstance(n, ast.Import) else [n])}
    assert mods <= {"__future__", "itertools", "re", "unicodedata", "collections.abc",
                    "dataclasses", "typing", "tkbox.errors"}, mods


def test_bounds() -> None:
    r = rs(API)
    assert r.decide_raw(b"GET", b"/" + b"a/" * 200, []).action == "refuse"
    assert r.decide_raw(b"GET", b"/" + b"a" * 9000, []).action == "refuse"
    with pytest.raises(RuleError):
        parse_rules("; ".join(["GET /x"] * 300))


# --- properties against the reference ----------------------------------------------

PIECES = ["a", "admin", "Admin", "repos", "acme", "app", "pulls", "x", "%61dmin", "%2F",
          "%2f", "%5C", "\\", ";", ";x=1", ".", "..", "%2e", "%2E%2e", "", "%25", "%252F",
          "%41", "%ef%bc%8f", "%c0%af", "~", "%7e", "git", "info", "refs", "%20", "é",
          "%C3%A9", "git-upload-pack"]
QUERIES = ["", "?service=git-upload-pack", "?service=git-receive-pack",
           "?service=git-upload-pack&service=git-receive-pack",
           "?service=git-upload-pack;service=git-receive-pack", "?_method=DELETE", "?a=1",
           "?service=git-upload-pack&a=1", "?a=%zz", "?a=1;_method=PUT"]
METHODS = ["GET", "POST", "DELETE", "PUT", "get", "Post", "HEAD"]
PATTERNS = ["/**", "/admin/**", "/repos/*/app", "/repos/acme/*/pulls", "/a/*", "/x",
            "/*/*/info/refs?service=git-upload-pack", "/*/git-upload-pack", "/", "/*",
            "/a/**/x", "/repos/**"]
RULE_METHODS = ["*", "GET", "GET HEAD", "POST", "DELETE", "PUT POST"]

targets = st.builds(
    lambda segs, q: "/" + "/".join(segs) + q,
    st.lists(st.lists(st.sampled_from(PIECES), min_size=1, max_size=3).map("".join),
             min_size=1, max_size=5),
    st.sampled_from(QUERIES))
rules_st = st.lists(st.builds(lambda a, m, p: f"{a}{m} {p}".strip(),
                              st.sampled_from(["", "ask ", "refuse "]),
                              st.sampled_from(RULE_METHODS), st.sampled_from(PATTERNS)),
                    min_size=1, max_size=4)
headers_st = st.lists(st.tuples(
    st.sampled_from(["X-HTTP-Method-Override", "X-Method-Override", "content-type", "accept"]),
    st.sampled_from(["DELETE", "put", "application/x-www-form-urlencoded", "*/*"])),
    max_size=2)
RANK = {"allow": 0, "ask": 1, "refuse": 2}


@given(method=st.sampled_from(METHODS), target=targets, rules=rules_st, headers=headers_st)
def test_no_origin_reads_an_allowed_request_as_one_the_rules_refuse(
        method: str, target: str, rules: list[str], headers: list[tuple[str, str]]) -> None:
    """Whatever the matcher lets through (or holds for a person), every origin model
    reads as something the rules let through (or hold) too."""
    raw = target.encode("utf-8")
    got = rs(rules).decide_raw(method.encode(), raw, [(k.encode(), v.encode())
                                                      for k, v in headers])
    if got.action == "refuse":
        return
    for name, view in views(method, target, headers).items():
        ref = reference_verdict(rules, view)
        assert RANK[ref] <= RANK[got.action], (name, view, ref, got)


TRAPS = ["* /**", "refuse * /admin/**", "refuse DELETE PUT /**",
         "refuse * /*/*/info/refs?service=git-receive-pack", "refuse * /repos/acme/x"]
TRAP_PIECES = ["admin", "Admin", "%61dmin", "repos", "acme", "x", "X", ";", ";x=1", "%2F",
               "\\", "%5C", "", "info", "refs", "%ef%bc%8f", "h"]
trap_targets = st.builds(
    lambda segs, q: "/" + "/".join(segs) + q,
    st.lists(st.lists(st.sampled_from(TRAP_PIECES), min_size=1, max_size=2).map("".join),
             min_size=1, max_size=4),
    st.sampled_from([*QUERIES, "?a=1;_method=PUT", "?_method=delete"]))


@settings(max_examples=3000)
@given(method=st.sampled_from(METHODS), target=trap_targets, headers=headers_st)
def test_no_trick_reaches_what_a_refuse_rule_guards(
        method: str, target: str, headers: list[tuple[str, str]]) -> None:
    """Everything is allowed but what the refuse rules guard: any request the
    matcher lets through is one that no origin model reads as guarded."""
    got = rs(TRAPS).decide_raw(method.encode(), target.encode("utf-8"),
                               [(k.encode(), v.encode()) for k, v in headers])
    if got.action == "refuse":
        return
    for name, view in views(method, target, headers).items():
        assert reference_verdict(TRAPS, view) == "allow", (name, view, got)


plain_targets = st.builds(
    lambda segs: "/" + "/".join(segs),
    st.lists(st.sampled_from(["a", "admin", "repos", "acme", "app", "pulls", "x", "git",
                              "info", "refs"]), min_size=1, max_size=5))


@given(method=st.sampled_from(["GET", "POST", "DELETE", "PUT", "HEAD"]),
       target=plain_targets, rules=rules_st)
def test_on_plain_targets_the_matcher_is_the_reference(method: str, target: str,
                                                       rules: list[str]) -> None:
    """A target no origin reads two ways gets exactly the reference's verdict (the
    matcher refuses nothing the rules allow)."""
    got = rs(rules).decide_raw(method.encode(), target.encode(), [])
    assert got.action == reference_verdict(rules, views(method, target, [])["strict"])


@pytest.mark.parametrize("text,why", [
    ("github@x.test", "only a ruled preset can be aimed"),
    ("github-read@", "PRESET@HOST needs a host name"),
    ("api.test GET /x;", "one at the end"),
    ("api.test get /x", "methods are upper case"),
])
def test_allow_entries_that_do_not_parse_say_what_to_fix(text: str, why: str) -> None:
    with pytest.raises(UserError) as e:
        Allowlist([text])
    assert why in e.value.message and "\n" not in e.value.message
