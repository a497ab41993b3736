"""``python -m roost`` runs the ``roost`` command."""

from roost.cli import main

main()
