"""``python -m lockstep.verify``: see :mod:`lockstep.verify.cli`."""

import sys

from lockstep.verify.cli import main

sys.exit(main())
