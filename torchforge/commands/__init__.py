"""Thin command modules. Each exposes `register(app)`; the CLI imports the ones named in cli.COMMAND_MODULES."""
