"""The bash reader (`tkbox.signer.bash`): a command line into a tree, as a shell reads it.

The download-exec pack's tests (`test_signer_download_exec.py`) exercise it through
`analyze`; these look at the tree itself.
"""

from __future__ import annotations

import pytest

from tkbox.errors import TkboxError
from tkbox.signer.bash import MAX_COMMAND, ShellSyntaxError, parse_seq


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
