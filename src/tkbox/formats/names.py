"""The names a record and a signer request share: a run id and a record kind.

Apart from `formats.record` (which reads the clock for a record's default time), so
that `formats.wire`, a pure core, can bound a request's `run` and `kind` with them.
"""

from __future__ import annotations

import re

#: a run id: 1-128 of [A-Za-z0-9._:-], starting with a letter or digit
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
#: a record kind: two to eight dotted lower-case names (`tkbox.box.started`)
KIND = re.compile(r"[a-z][a-z0-9_-]*(\.[a-z][a-z0-9_-]*){1,7}")
