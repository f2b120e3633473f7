"""`python -m keras_transformer` runs the command line (see `keras_transformer.cli`)."""

import sys

from keras_transformer.cli import main

sys.exit(main())
