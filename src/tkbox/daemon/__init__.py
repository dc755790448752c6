"""tkbox.daemon."""
