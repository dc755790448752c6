"""tkbox.cli."""
