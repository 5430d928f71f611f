"""CLI verbs: serve. (Filled in by the owning module's work.)"""

import typer


def register(app: typer.Typer) -> None:
    """Add this module's verbs to the app."""
