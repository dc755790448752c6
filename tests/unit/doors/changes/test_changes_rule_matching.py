"""The fast paths of the sensitive-file rules and of `fold` decide exactly as the plain ones.

`sensitive_reason` matches file names with one combined regex and skips the
directory rules when no component can start one; `fold` takes a shortcut for
ASCII. A shortcut that disagreed would let a sensitive file through unheld, so
each is checked against the plain computation it replaces.
"""

from __future__ import annotations

import random
import unicodedata
from fnmatch import fnmatchcase

from tkbox.doors.changes import sensitive
from tkbox.doors.changes.paths import fold

NAMES = [".env", ".env.local", "a.pem", "id_rsa.pub", "jenkinsfile", "jenkinsfile.groovy",
         "azure-pipelines-ci.yml", "service-account-x.json", "credentials.json", "x.py",
         "tkbox.yaml", "pip.conf", "config.json", ".gitlab-ci.yml", "env", "a.pem.txt",
         "id_rsa", "cloudbuild.yml", ".npmrc", "readme.md", "*.pem", "[x].key"]


def _plain_name_reason(name: str) -> str | None:
    for pattern, why in sensitive._NAMES:
        if fnmatchcase(name, pattern):
            return why
    return None


def test_combined_name_regex_picks_the_first_rule_a_loop_would() -> None:
    """A name matching two globs (`a.pem` vs `*.pem`) gets the first rule's reason, as
    before; a name matching none is not held back by the regex."""
    rng = random.Random(7)
    pieces = [".", "env", "pem", "key", "id_rsa", "-", "json", "yml", "service-account",
              "jenkinsfile", "x", "*", "[", "]"]
    names = NAMES + ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 4)))
                     for _ in range(5000)]
    for name in names:
        m = sensitive._NAMES_RE.match(name)
        got = sensitive._NAMES[int(m.lastgroup[1:])][1] if m and m.lastgroup else None
        assert got == _plain_name_reason(name), name


def test_directory_rules_are_skipped_only_when_no_component_could_start_one() -> None:
    """Every directory and pair rule, spelled in any case and at any depth, still holds
    the file back; ordinary paths are not held back."""
    for prefix, why in sensitive._DIRS:
        spelled = "/".join(p.upper() for p in prefix)
        assert sensitive.sensitive_reason(f"src/{spelled}/x") == why
        assert sensitive.sensitive_reason(f"{'/'.join(prefix[:1])}") is not None
    assert sensitive.sensitive_reason("src/.Docker/CONFIG.JSON") is not None
    assert sensitive.sensitive_reason("src/pkg/mod.py") is None


def test_ascii_fold_shortcut_equals_full_normalisation() -> None:
    rng = random.Random(3)
    for _ in range(20000):
        s = "".join(chr(rng.randint(0, 127)) for _ in range(rng.randint(1, 12)))
        full = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", s).casefold())
        assert fold(s) == full, s


def test_quote_path_quick_check_quotes_exactly_what_git_quotes() -> None:
    """A name with any byte git's quote_c_style escapes is quoted; any other is not."""
    from tkbox.doors.changes.patch import quote_path

    for c in range(256):
        git_quotes = c < 0x20 or c in (0x22, 0x5C) or c >= 0x7F
        name = b"a" + bytes([c]) + b"b"
        assert (quote_path(name) != name) == git_quotes, c
