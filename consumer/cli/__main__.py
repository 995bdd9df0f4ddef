"""`python -m consumer.cli`: the `promptbus` command."""

import sys

from consumer.cli import main

sys.exit(main())
