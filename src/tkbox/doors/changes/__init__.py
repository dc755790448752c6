"""tkbox.doors.changes: the code-changes door (`tkbox apply`).

The guest's patch reaches the user's checkout only through `apply_patch`,
which follows DESIGN §7's six steps (see `door`). Pure cores: `patch` (the
parser and exact applier), `paths` (which paths may be named), `sensitive`
(what is held back), `plan` (old and final states, symlink rules). Shells:
`git` (git with nothing but the patch steering it), `fs` (no-follow reads and
the all-or-nothing writer), `door`. `report` renders the result.
"""

from tkbox.doors.changes.door import apply_patch, ignored_paths
from tkbox.doors.changes.errors import ApplyFailed, PatchRefused
from tkbox.doors.changes.patch import Limits
from tkbox.doors.changes.report import ApplyReport, FileResult, render_report

__all__ = ["ApplyFailed", "ApplyReport", "FileResult", "Limits", "PatchRefused", "apply_patch",
           "ignored_paths", "render_report"]
