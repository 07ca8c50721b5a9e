"""`python -m pipeline` is the `nmt` command."""

from .cli import run

run()
