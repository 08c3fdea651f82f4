"""``python -m lockstep_verify``: see :mod:`lockstep_verify.cli`."""

import sys

from lockstep_verify.cli import main

sys.exit(main())
