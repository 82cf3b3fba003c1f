"""The ``vramguard`` command and its subcommands (``operator``, ``top``,
``replay``, ``analyze``)."""
