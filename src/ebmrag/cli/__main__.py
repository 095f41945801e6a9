"""`python -m ebmrag.cli ...`: the command line started by an interpreter, for tests and bench scripts that run
a source tree on PYTHONPATH where no `ebmrag` script is installed."""

from ebmrag.cli import app

app()
