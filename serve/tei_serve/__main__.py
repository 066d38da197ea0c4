"""`python -m tei_serve` is `tei-serve`."""

import sys

from tei_serve.cli import main

sys.exit(main())
