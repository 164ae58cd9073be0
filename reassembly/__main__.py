"""``python -m reassembly``: the reassemble command."""

import sys

from .cli import main

sys.exit(main())
