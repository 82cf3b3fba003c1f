"""Both labelled leak corpora: the tuning corpus (``tuning``) and the independent one (``independent``)."""
