"""tkbox.formats: the bytes of the record, pure and strict.

Everything here is a pure function of bytes (no I/O, no clock unless passed
in), uses only the standard library and `cryptography`, and is what the
offline verifier (`tkbox.verify`) is allowed to import.

| module        | format                                                    |
| ------------- | --------------------------------------------------------- |
| `merkle`      | RFC 6962 / RFC 9162 hashing, inclusion and consistency    |
| `note`        | C2SP signed-note (Go `golang.org/x/mod/sumdb/note`)       |
| `checkpoint`  | C2SP tlog-checkpoint                                      |
| `cosignature` | C2SP tlog-cosignature, `cosignature/v1` (type 0x04)       |
| `witness`     | C2SP tlog-witness `add-checkpoint` request and response   |
| `tlogpolicy`  | C2SP tlog-policy                                          |
| `proof`       | C2SP tlog-proof                                           |
| `canonjson`   | RFC 8785 canonical JSON (the subset records use)          |
| `record`      | tkbox's log record (one leaf)                             |
| `bundle`      | tkbox's `.tkb` bundle and `.trust.json` trust file        |
| `wire`        | the signer's framing and typed requests (both ends share) |
| `names`       | a run id and a record kind (shared by `record` and `wire`)  |
| `workload`    | who recorded a remote run (the open record's `workload`)  |

Errors:

```
tkbox.errors.BundleError          anything under verification is wrong
└── FormatError                   ... with `code` (stable, for programs),
                                  `where` (which part, which line) and
                                  `what` (one line for a person)
tkbox.errors.RemoteError
└── wire.WireError                the signer's peer broke the framing
    ├── wire.BadSignerRequest           a frame that is not one of the requests (`.id`)
    └── wire.BadSignerAnswer            a frame from the signer that is no answer or push
```

Every parser bounds sizes before reading, accepts only the canonical form
(an integer must print back as the digits it came from, base64 must
re-encode to the same text, JSON must re-serialize to the same bytes), and
raises `FormatError` for anything else: never a bare `ValueError`,
`KeyError` or `binascii.Error`.
"""

from tkbox.errors import BundleError
from tkbox.formats.errors import FormatError

__all__ = ["BundleError", "FormatError"]
