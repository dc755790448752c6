"""tkbox.guest."""
