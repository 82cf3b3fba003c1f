"""``python -m vramguard_operator`` runs the ``vramguard`` command."""

import sys

from vramguard_operator.cli.main import main

sys.exit(main())
