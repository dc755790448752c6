"""tkbox: each AI-agent job in its own micro-VM with no network card.

Every crossing out of the VM goes through a door on the host, every door asks
a signer the VM cannot reach, and every job ends as one verifiable bundle.
"""

__version__ = "0.1.0"

__all__ = ["AsyncClient", "Client", "__version__"]


def __getattr__(name: str) -> object:
    # Lazy, so that the guest agent and the verifier, which import `tkbox`,
    # never load httpx or the SDK.
    if name in ("Client", "AsyncClient"):
        from tkbox import sdk

        return getattr(sdk, name)
    raise AttributeError(f"module 'tkbox' has no attribute {name!r}")
