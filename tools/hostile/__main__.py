"""`python -m tools.hostile`: write (or `--check`) the corpus in tests/data/hostile/."""

import sys

from .generate import main

sys.exit(main())
