"""`python -m ebmrag ...` runs the same command line as `ebmrag ...`."""

from ebmrag.cli import app

app(prog_name="ebmrag")
