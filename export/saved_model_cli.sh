#!/usr/bin/env bash
# TensorFlow's own `saved_model_cli` (the session-based SavedModel loader TF Serving uses), run
# in a Python that has imported `tensorflow_text` first so the SentencePiece ops the exported
# graph uses are registered (TF Serving's model server links the same ops into its binary).
# Usage: export/saved_model_cli.sh run --dir DIR/1 --tag_set serve --signature_def translate \
#          --input_exprs 'text=["A dog runs."]'
set -euo pipefail
PY=${PYTHON:-python}
exec "$PY" -c 'import sys, tensorflow_text
from tensorflow.python.tools import saved_model_cli
sys.argv[0] = "saved_model_cli"
saved_model_cli.main()' "$@"
