# The two commands of the README: `make run` (the main job) and `make test` (the suite).
# Both create or reuse the virtual environment in $(VENV) and install what they need.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
RUN_DIR ?= runs/quick
PRESET ?= quick
TRAIN_ARGS ?=
EVAL_ARGS ?=
PYTEST_ARGS ?=
# The suite's worker processes (pytest-xdist); 0 runs it in this process. Most tests wait
# on Python and small graphs, so two workers on two cores ran the suite in 21.7 minutes
# where one took 32-35 (benchmarks/RESULTS.md, session 54). Two, not one per core: each
# runs TensorFlow with its own thread pools, and `auto` counts a container's host cores.
PYTEST_WORKERS ?= 2

.PHONY: install run test test-fast notebooks benchmarks clean

install: $(STAMP)

$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev,serving]"
	touch $(STAMP)

# Train the `quick` preset on Multi30K En->De, then print translations and test_2016 BLEU.
# Run it again and it picks up where it stopped: an interrupted training resumes from its
# last epoch, a finished run is reused (its export and evaluation too, printed again in
# seconds; an export cut short is made again). A model trained again is exported as the next
# version of $(RUN_DIR)/export (the directory export/docker-compose.yml serves), never in
# place of one a server may hold. `make run FRESH=1` deletes the run and starts over.
# PRESET, TRAIN_ARGS and EVAL_ARGS change the recipe (e.g. the tests' tiny runs).
run: $(STAMP)
	$(PY) -m keras_transformer train --preset $(PRESET) --output $(RUN_DIR) $(if $(FRESH),--overwrite) $(TRAIN_ARGS)
	@if [ ! -d $(RUN_DIR)/export ] || [ $(RUN_DIR)/model.keras -nt $(RUN_DIR)/export ] || \
		! ls -d $(RUN_DIR)/export/[0-9]* > /dev/null 2>&1; then \
		rm -f $(RUN_DIR)/evaluation.txt && \
		echo "$(PY) -m keras_transformer export --model $(RUN_DIR) --out $(RUN_DIR)/export" && \
		$(PY) -m keras_transformer export --model $(RUN_DIR) --out $(RUN_DIR)/export; \
	else echo "Reusing the export in $(RUN_DIR)/export"; fi
	@if [ ! -f $(RUN_DIR)/evaluation.txt ]; then \
		echo "$(PY) -m keras_transformer evaluate --export $(RUN_DIR)/export --split test --show 5 $(EVAL_ARGS)" && \
		$(PY) -m keras_transformer evaluate --export $(RUN_DIR)/export --split test --show 5 $(EVAL_ARGS) \
			> $(RUN_DIR)/evaluation.tmp && mv $(RUN_DIR)/evaluation.tmp $(RUN_DIR)/evaluation.txt; \
	else echo "Reusing the evaluation of $(RUN_DIR)/export:"; fi
	@cat $(RUN_DIR)/evaluation.txt

# The whole suite, slow tests and notebooks included (CI runs this).
test: $(STAMP)
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)
	KT_NOTEBOOK_CI=1 $(PY) -m pytest --nbmake --nbmake-timeout=900 notebooks

# Everything but the tests marked slow.
test-fast: $(STAMP)
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile -m "not slow" $(PYTEST_ARGS)

# The decoding benchmark times `make run`'s model (trained first if it is not there).
benchmarks: run
	$(PY) benchmarks/train_throughput.py
	$(PY) benchmarks/decode_speed.py --run $(RUN_DIR)

clean:
	rm -rf $(VENV) runs .pytest_cache
