"""``python -m vramguard_agent`` runs the ``vramguard-agent`` command."""

import sys

from .cli import main

sys.exit(main())
