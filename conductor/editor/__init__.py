"""The conductor as the editor: the client connection, `run` (a turn, its policies and
rendering) and `check`."""
