"""The command line's parts that are not commands: its parser and argument types (``cli.py`` runs the
commands over the library)."""
