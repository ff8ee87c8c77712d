"""``python -m fuseflow``: the same as the ``fuseflow`` command."""

import sys

from fuseflow.cli import main

sys.exit(main())
