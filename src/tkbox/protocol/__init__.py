"""tkbox.protocol."""
