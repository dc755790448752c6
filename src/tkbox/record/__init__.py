"""tkbox.record."""
