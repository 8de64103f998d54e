"""nvhook: the hook binary and command-line interface."""
