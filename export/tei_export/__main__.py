import sys

from tei_export.cli import main

sys.exit(main())
