"""The bash reader (`tkbox.signer.bash`): a command line into a tree, as a shell reads it.

The download-exec pack's tests (`test_signer_download_exec.py`) exercise it through
`analyze`; these look at the tree itself.
"""

from __future__ import annotations

import subprocess

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tkbox.errors import TkboxError
from tkbox.signer.bash import MAX_COMMAND, ShellSyntaxError, Simple, parse_seq


def test_parser_reads_quotes_and_substitutions() -> None:
    seq = parse_seq("FOO=1 echo 'a b' \"c $(date) d\" $'e\\tf' 2>&1 | cat")
    cmd = seq.pipelines[0].commands[0]
    assert [w.show() for w in cmd.words] == ["echo", "a b", "c $(…) d", "e\tf"]
    assert [(r.op, r.fd) for r in cmd.redirs] == [(">&", 2)]
    assert len(seq.pipelines[0].commands) == 2


@pytest.mark.parametrize("cmd", ["echo 'open", "echo \"open", "echo $(open", "case x in",
                                 "x" * (MAX_COMMAND + 1), "a | ", "echo ${x"])
def test_what_it_cannot_read_is_one_error_of_the_tree(cmd: str) -> None:
    """An unreadable command line raises ShellSyntaxError (a TkboxError: one line), never
    a bare exception, so the pack can say `parsed: False` instead of guessing."""
    with pytest.raises(ShellSyntaxError) as info:
        parse_seq(cmd)
    assert isinstance(info.value, TkboxError) and "\n" not in str(info.value)


# Words as bash itself reads them: runs of ordinary characters, quotes and escapes,
# mixed in one word, words apart by blanks. No expansion (`$`, backquotes, a leading
# `~`, globs, braces, `#`), so that bash prints each word exactly as it was read.
_ORDINARY = st.text(alphabet="abcxyzABC0123456789._/=:,@%+-", min_size=1, max_size=6)
_SINGLE = st.text(alphabet=st.characters(codec="ascii", exclude_characters="'\x00"),
                  max_size=6).map(lambda t: f"'{t}'")
_DOUBLE = st.text(alphabet=st.characters(codec="ascii", exclude_characters='"\\$`!\x00'),
                  max_size=6).map(lambda t: f'"{t}"')
_ESCAPED = st.sampled_from(list(" ;&|()<>'\"\\*?[]{}#~$`!\t")).map(lambda c: "\\" + c)
_WORD = st.lists(st.one_of(_ORDINARY, _SINGLE, _DOUBLE, _ESCAPED), min_size=1,
                 max_size=5).map("".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(words=st.lists(_WORD, min_size=1, max_size=6), gaps=st.lists(
    st.sampled_from([" ", "\t", "  ", " \t "]), min_size=6, max_size=6))
def test_words_are_read_as_bash_reads_them(words: list[str], gaps: list[str],
                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    """The reader's words are bash's: checked against bash itself, word for word."""
    line = "printf '%s\\0'" + "".join(g + w for g, w in zip(gaps, words, strict=False))
    assume(not line.rstrip().endswith("\\"))
    cwd = tmp_path_factory.mktemp("empty")  # nothing for a stray glob to match
    out = subprocess.run(["bash", "--norc", "--noprofile", "-c", line], cwd=cwd,
                         capture_output=True, check=True, env={"PATH": "/usr/bin:/bin"})
    theirs = out.stdout.split(b"\0")[:-1]
    cmd = parse_seq(line).pipelines[0].commands[0]
    assert isinstance(cmd, Simple)
    ours = [w.literal() for w in cmd.words[2:]]
    assert [o.encode() if o is not None else None for o in ours] == theirs, line
