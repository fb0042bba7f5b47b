"""``python -m orchestration.cli``: the same command as the ``dueledger`` console script."""

from orchestration.cli import main

main()
