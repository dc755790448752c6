"""tkbox.doors.network."""
