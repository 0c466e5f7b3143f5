"""`python -m rsc` is the `rsc` command."""

from rsc.cli import main

main()
