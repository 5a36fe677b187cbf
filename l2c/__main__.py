"""`python -m l2c` is the `l2c` command."""
import sys

from .cli import main

sys.exit(main())
