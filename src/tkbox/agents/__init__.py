"""`tkbox agent`: run a coding agent headless in a box, on a prompt, and keep its patch.

`job` runs one job through the SDK; `image` builds the Claude Code image once.
"""
