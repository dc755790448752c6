"""tkbox.signer."""
