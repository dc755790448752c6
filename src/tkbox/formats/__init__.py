"""tkbox.formats."""
