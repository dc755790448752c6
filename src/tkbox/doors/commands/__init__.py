"""tkbox.doors.commands."""
