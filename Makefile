# pipeplan: every target makes the virtual environment it needs.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast docs bench lint venv clean

venv: $(STAMP)

# torch is pinned to the CPU wheel on this machine's disk: a bare `torch` would pull a CUDA build.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0 numpy
	$(PY) -m pip install -q -e '.[torch,dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/pipeplan demo

# the whole suite, then its 15 slowest tests
test: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadfile --durations=15 tests

# the pure core in under a minute: no test that needs torch or starts processes or takes more than about 5 s
test-fast: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadfile -m "not torch and not slow" tests

# Run every example of README.md and docs/*.md and rewrite the output each shows (tests/test_docs.py checks them).
docs: $(STAMP)
	$(PY) tests/docs_refresh.py

bench: $(STAMP)
	for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# ruff; import-linter (the contracts in pyproject.toml: the layers, torch only where it belongs, search above
# baselines); vulture (dead code: src, tests and benchmarks count as uses, vulture_whitelist.py the dynamic ones)
lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks vulture_whitelist.py
	$(VENV)/bin/ruff format --check src tests benchmarks vulture_whitelist.py
	$(VENV)/bin/lint-imports
	$(VENV)/bin/vulture src tests benchmarks vulture_whitelist.py

clean:
	rm -rf $(VENV) out .pytest_cache .ruff_cache
