"""``python -m ltc_cache.cli``: the ``ltc-cache`` command without its script."""

import sys

from . import main

sys.exit(main())
