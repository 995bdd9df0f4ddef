"""`python -m consumer.localmodel serve|stop|status|fetch`."""

import sys

from consumer.localmodel.cli import main

sys.exit(main())
