"""`python -m pipeline` is the `nmt` command."""

import sys

from .cli import main

sys.exit(main())
