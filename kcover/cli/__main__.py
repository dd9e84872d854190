"""`python -m kcover.cli`: the `kcover` command."""

import sys

from kcover import cli

sys.exit(cli.main())
