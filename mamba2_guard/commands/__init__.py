"""The CLI's commands, one module each (as asv's ``commands/``): ``register(subparsers)`` declares the
command and its flags, ``run(args)`` runs it and returns the exit code. ``mamba2_guard.cli`` dispatches."""
