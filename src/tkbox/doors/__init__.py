"""tkbox.doors."""
