"""tkbox.verify: the offline verifier.

`verify_bundle(bundle_bytes, trust_bytes) -> Report` (in `core`) imports only
`tkbox.formats`; `verify_command` (in `cli`) is the `tkbox verify` command.
"""

from tkbox.verify.core import Report, verify_bundle

__all__ = ["Report", "verify_bundle"]
