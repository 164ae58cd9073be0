"""The ``reassemble`` command: ``main`` holds the parser and the table of subcommands; one module per subcommand.

Nothing in the library imports this package but ``reassembly.__main__`` (and the console script):
the command sits on top of the jobs, never under them.
"""
