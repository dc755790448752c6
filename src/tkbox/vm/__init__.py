"""tkbox.vm."""
