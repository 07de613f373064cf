"""``python -m tfd`` is the ``tfd`` command."""

from tfd.cli import main

main()
