"""``python -m osa_lab``: the ``osa-lab`` command line (:mod:`osa_lab.cli`)."""

import sys

from osa_lab.cli import main

if __name__ == "__main__":
    sys.exit(main())
