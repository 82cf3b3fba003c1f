"""``python -m vramguard_operator`` runs the ``vramguard`` command."""

import sys

from vramguard_operator.cli import main

sys.exit(main())
