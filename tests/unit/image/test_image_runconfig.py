"""An image's Env and User, read as a container runtime reads them, from the image's own
databases (which are as hostile as any other byte of the image)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tkbox.errors import UserError
from tkbox.image.runconfig import (
    MAX_ENV,
    MAX_ENV_BYTES,
    MAX_ENV_ENTRY,
    MAX_ENV_NAME,
    MAX_ENV_NAMES_RECORDED,
    image_env,
    recorded_names,
    resolve_user,
)

PASSWD = ("root:x:0:0:root:/root:/bin/sh\n# a comment\nbroken line\n"
          "node:x:1000:1000::/home/node:/bin/sh\nsvc:x:998:997:svc:relative:/bin/false\n"
          "odd:x:notanumber:1:::\n")
GROUP = "root:x:0:\nnode:x:1000:\ndocker:x:999:node,svc\nstaff:x:50:svc\n"


def test_a_name_resolves_with_its_home_and_groups() -> None:
    u = resolve_user("node", PASSWD, GROUP)
    assert u is not None and (u.uid, u.gid, u.groups, u.home) == (1000, 1000, (999, 1000),
                                                                  "/home/node")


def test_a_number_need_not_be_in_passwd() -> None:
    u = resolve_user("4242", PASSWD, GROUP)
    assert u is not None and (u.uid, u.gid, u.home) == (4242, 4242, "/")
    u = resolve_user("1000", PASSWD, GROUP)
    assert u is not None and u.home == "/home/node"  # a uid that is in passwd gets its home


def test_a_group_by_name_or_number() -> None:
    u = resolve_user("node:docker", PASSWD, GROUP)
    assert u is not None and u.gid == 999
    u = resolve_user("svc:12", PASSWD, GROUP)
    assert u is not None and (u.uid, u.gid, u.home) == (998, 12, "/")  # a relative home is /


@pytest.mark.parametrize("spec", ["", "root", "0", "0:0"])
def test_root_means_nothing_to_switch(spec: str) -> None:
    assert resolve_user(spec, PASSWD, GROUP) is None


@pytest.mark.parametrize("spec,what", [("ghost", "'ghost'"), ("node:nogroup", "'nogroup'"),
                                       ("odd", "'odd'"), ("99999999999", "'99999999999'")])
def test_a_user_or_group_the_image_does_not_define_is_a_one_line_error(spec: str,
                                                                         what: str) -> None:
    with pytest.raises(UserError, match=what):
        resolve_user(spec, PASSWD, GROUP)


@pytest.mark.parametrize("uid", ["\u00b2", "1\u0663", "\uff11"])
def test_a_non_ascii_digit_in_an_image_id_is_a_user_error_not_a_crash(uid: str) -> None:
    """A hostile image's passwd or User holding digits that `str.isdigit` accepts and
    `int` refuses ('\u00b2', Arabic-Indic, fullwidth) gets the one-line error, not a
    ValueError escaping into the daemon."""
    with pytest.raises(UserError):
        resolve_user(uid, PASSWD, GROUP)
    with pytest.raises(UserError):
        resolve_user("x", f"x:x:{uid}:{uid}:x:/home/x:/bin/sh\n", GROUP)


def test_env_keeps_valid_names_in_order_and_is_bounded() -> None:
    env = image_env(("PATH=/a:/b", "A=1=2", "bad name=x", "=x", "NOEQ", "A=3", "Z=\x00x"))
    assert env == {"PATH": "/a:/b", "A": "3"}
    big = image_env(tuple(f"V{i}=x" for i in range(MAX_ENV * 2)))
    assert len(big) == MAX_ENV




def test_env_beyond_what_a_box_can_run_with_is_refused_not_cut() -> None:
    """A variable over Linux's MAX_ARG_STRLEN would make every exec fail with E2BIG,
    and a huge Env would not fit the boot config: refused with one line naming the
    variable and the limits; a name too long to be one is skipped, as a bad name is."""
    with pytest.raises(UserError, match=f"BIG to more than a box can take \\({MAX_ENV_ENTRY}"):
        image_env(("A=1", "BIG=" + "x" * MAX_ENV_ENTRY))
    many = tuple(f"V{i}=" + "x" * 1000 for i in range(MAX_ENV_BYTES // 1000 + 1))
    with pytest.raises(UserError, match="in all"):
        image_env(many)
    assert image_env(("N" * (MAX_ENV_NAME + 1) + "=1", "N=2")) == {"N": "2"}
    assert len(image_env(tuple(f"V{i}=" + "x" * 400 for i in range(MAX_ENV)))) == MAX_ENV


def test_the_recorded_names_are_bounded() -> None:
    env = {f"{'N' * 250}{i:03d}": "" for i in range(MAX_ENV)}  # 128 KiB of names
    names = recorded_names(env)
    assert sum(len(n) + 1 for n in names) <= MAX_ENV_NAMES_RECORDED + 40
    assert names[-1] == f"... and {MAX_ENV - len(names) + 1} more"
    assert names[:-1] == sorted(env)[:len(names) - 1]
    assert recorded_names({"B": "", "A": ""}) == ["A", "B"]


@given(st.text(max_size=2000), st.text(max_size=2000), st.text(max_size=40))
def test_any_database_and_spec_give_a_user_or_a_user_error(passwd: str, group: str,
                                                           spec: str) -> None:
    """Fuzz: an image's passwd, group and User never raise anything but UserError."""
    try:
        u = resolve_user(spec, passwd, group)
    except UserError:
        return
    if u is not None:
        assert 0 < u.uid < 2**32 and 0 <= u.gid < 2**32 and u.home.startswith("/")
