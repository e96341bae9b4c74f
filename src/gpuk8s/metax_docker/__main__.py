"""``python -m gpuk8s.metax_docker ARGS``: the same as ``metax-docker ARGS``."""

import sys

from .main import main

sys.exit(main())
