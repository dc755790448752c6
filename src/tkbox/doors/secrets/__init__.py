"""tkbox.doors.secrets."""
