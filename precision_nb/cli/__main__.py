"""``python -m precision_nb.cli``: the same as the ``precision-nb`` command."""

import sys

from precision_nb.cli.main import main

sys.exit(main())
