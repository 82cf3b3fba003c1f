"""``python -m vramguard_sim`` runs the ``vramguard-sim`` command."""

import sys

from .cli import main

sys.exit(main())
