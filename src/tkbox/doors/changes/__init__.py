"""tkbox.doors.changes."""
