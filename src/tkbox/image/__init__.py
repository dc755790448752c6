"""tkbox.image."""
