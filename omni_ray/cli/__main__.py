"""``python -m omni_ray.cli``: the ``omni-ray`` command."""

import sys

from omni_ray.cli import main

sys.exit(main())
