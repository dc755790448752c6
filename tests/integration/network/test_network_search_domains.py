"""The host resolver's `search` domains never complete a box's name (a real resolver).

`netns_dns.py` runs glibc's own resolver in fresh network and mount
namespaces: only loopback, a DNS server on 127.0.0.1 that knows
`intranet.corp.example` (a public address) and nothing else, and a private
`resolv.conf` with `search corp.example`. Nothing leaves the machine and
nothing outside that one process is changed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from netns_dns import COMPLETED, run_in_namespaces

import tkbox

pytestmark = pytest.mark.integration

SRC = Path(tkbox.__file__).resolve().parents[1]


def test_search_domain_never_completes_a_name_the_door_resolves() -> None:
    """Stops `--allow intranet` (or an approved `intranet`) reaching the public
    address of `intranet.<search domain>`: the door asks for `intranet.`, which
    does not exist, however the box wrote the name."""
    spellings = ["intranet", "Intranet", "intranet.", "INTRANET."]
    got = run_in_namespaces(spellings, SRC)
    if got is None:
        pytest.skip("cannot make network and mount namespaces here (unshare)")
    # the control: the host's resolver, asked the usual way, completes the name
    assert got["plain"]["intranet"] == [COMPLETED["intranet.corp.example"]]
    for name in spellings:
        assert isinstance(got["door"][name], dict), (name, got["door"][name])
        assert "does not resolve" in got["door"][name]["error"]
        # what reached the DNS server: the absolute name only, never the completed one
        assert set(got["asked"][name]) == {"intranet"}, (name, got["asked"][name])
