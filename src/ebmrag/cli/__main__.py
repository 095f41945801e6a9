from ebmrag.cli import app

app()
