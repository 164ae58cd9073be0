"""``python -m reassembly``: the reassemble command."""

import sys

from reassembly.cli.main import main

sys.exit(main())
