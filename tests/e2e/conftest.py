"""pytest wiring for the e2e tests; the helpers live in `e2e_stack` (a unique module
name, so it cannot collide with other folders' conftest modules)."""

from e2e_stack import box, own_stack, pytest_collection_modifyitems, stack, workspace

__all__ = ["box", "own_stack", "pytest_collection_modifyitems", "stack", "workspace"]
