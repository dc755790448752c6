"""tkbox.doors.secrets: secrets never enter the box (docs/secrets.md).

Pure core: `spec` (the --secret flag), `scan` (leak scanner, redactor),
`swap` (the bound header), `rules` (one request, one response), `ca` (the
box CA), `model` (model name and usage). Shell: `tlsstream`, `door`.
`prestart`: checks before a box starts and a command runs.
"""

from tkbox.doors.secrets.door import SecretsDoor
from tkbox.doors.secrets.spec import Secret, SecretSpec

__all__ = ["Secret", "SecretSpec", "SecretsDoor"]
