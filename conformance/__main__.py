"""`python -m miserver.conformance ...`, the same as `miserver-conformance ...`."""

import sys

from .cli import main

sys.exit(main())
