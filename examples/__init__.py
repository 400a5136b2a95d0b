"""Runnable examples of railmq features (`python -m examples.<name>`)."""
