"""`python -m tools.device_check`: the device check's table on stdout (see the package)."""

import sys

from . import main

sys.exit(main())
