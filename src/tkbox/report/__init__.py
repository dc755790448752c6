"""`tkbox report`: a bundle as one self-contained HTML page a person can read.

The page verifies first (`tkbox.verify.verify_bundle`, the same check as
`tkbox verify`) and says VERIFIED or FAILED at its top. Only a bundle that
verified is shown as a timeline: a FAILED page names the first fault and shows
no record, since nothing in such a bundle can be relied on.

The timeline is built from the records by a pure function (`Timeline.build`):
commands with their exits and durations, connections by host and verdict,
approvals and who answered, secret uses and leaks, model calls with tokens,
files written and held back, and every record in order.

Every string on the page comes from the bundle, and much of it from the guest
(command lines, paths, host names, refusal reasons): all of it is escaped and
bounded (`_text`). The page holds no script, loads nothing from anywhere (its
Content-Security-Policy says `default-src 'none'`), and needs no network.
"""

from __future__ import annotations

from tkbox.report.html import render_html
from tkbox.report.timeline import Timeline, build_report

__all__ = ["Timeline", "build_report", "render_html"]
