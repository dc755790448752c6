"""tkbox: each AI-agent job in its own micro-VM with no network card.

Every crossing out of the VM goes through a door on the host, every door asks
a signer the VM cannot reach, and every job ends as one verifiable bundle.
"""

__version__ = "0.1.0"
