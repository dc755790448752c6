"""tkbox.verify."""
