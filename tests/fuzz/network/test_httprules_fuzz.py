"""Fuzzing the request rules: any request gets a verdict, any rules text parses or is
one `RuleError`, and what is allowed stays allowed under every origin model.

Promise: `RuleSet.decide_raw` never raises, whatever the method, target and headers
(an unreadable request is a refusal); `parse_rules` returns rules or raises
`RuleError`, nothing else. The property of `test_network_httprules` (no origin model
reads an allowed request as a refused one) runs here on wider input for `make fuzz`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tkbox.doors.network.httprules import RuleError, RuleSet, parse_rules

sys.path.insert(0, str(Path(__file__).parents[2] / "unit" / "doors" / "network"))
from httprules_reference import reference_verdict, views  # noqa: E402

FUZZ = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
RULES = RuleSet("api.test", parse_rules(
    "GET HEAD /**; POST /repos/acme/app/pulls; ask DELETE /repos/*/*/git/refs/**; "
    "refuse * /admin/**; GET /*/*/info/refs?service=git-upload-pack"))
TEXT = ["GET HEAD /**", "POST /repos/acme/app/pulls", "ask DELETE /repos/*/*/git/refs/**",
        "refuse * /admin/**", "GET /*/*/info/refs?service=git-upload-pack"]

_bytes_pieces = st.sampled_from([
    b"/", b"//", b"admin", b"Admin", b"%", b"%2", b"%2F", b"%2f", b"%5C", b"\\", b";", b".",
    b"..", b"%2e", b"%25", b"%252F", b"?", b"&", b"=", b"#", b"_method", b"service",
    b"git-upload-pack", b"\x00", b"\xff", b"%c0%af", b"%ef%bc%8f", b"repos", b"acme", b" ",
    b"x" * 300])
targets = st.one_of(st.binary(max_size=300),
                    st.lists(_bytes_pieces, max_size=30).map(b"".join))
methods = st.one_of(st.sampled_from([b"GET", b"get", b"POST", b"DELETE", b"", b"G ET"]),
                    st.binary(max_size=40))
headers = st.lists(st.tuples(
    st.sampled_from([b"X-HTTP-Method-Override", b"x-method-override", b"content-type",
                     b"host"]), st.binary(max_size=60)), max_size=4)


@FUZZ
@given(method=methods, target=targets, hdrs=headers)
def test_any_request_gets_a_verdict(method: bytes, target: bytes,
                                    hdrs: list[tuple[bytes, bytes]]) -> None:
    v = RULES.decide_raw(method, target, hdrs)
    assert v.action in ("allow", "ask", "refuse")
    assert v.reason and len(v.reason) < 2000


@FUZZ
@given(text=st.one_of(st.text(max_size=200), st.lists(st.sampled_from(
    ["GET", "ask", "refuse", "allow", "*", "**", "/", "/a", "?", "=", "&", ";", " ", "%",
     "POST", "/**", "/*"]), max_size=20).map(" ".join)))
def test_rules_text_parses_or_is_a_rule_error(text: str) -> None:
    try:
        rules = parse_rules(text)
    except RuleError as e:
        assert "\n" not in e.message
        return
    RuleSet("x.test", rules).decide_raw(b"GET", b"/", [])


printable = st.lists(st.sampled_from(
    ["/", "//", "admin", "Admin", "%2F", "%5C", "\\", ";", ";x=1", "%61", "dmin", "repos",
     "acme", "app", "git", "refs", "info", "?service=git-upload-pack", "&", "?_method=PUT",
     "%ef%bc%8f", "x", ""]), min_size=1, max_size=12).map(lambda p: "/" + "".join(p))


@FUZZ
@given(method=st.sampled_from(["GET", "POST", "DELETE", "HEAD", "PUT"]), target=printable)
def test_what_is_allowed_no_origin_model_refuses(method: str, target: str) -> None:
    got = RULES.decide_raw(method.encode(), target.encode(), [])
    if got.action == "refuse":
        return
    rank = {"allow": 0, "ask": 1, "refuse": 2}
    for name, view in views(method, target, []).items():
        assert rank[reference_verdict(TEXT, view)] <= rank[got.action], (name, view)
