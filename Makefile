# pipeplan: every target makes the virtual environment it needs.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test docs bench lint venv clean

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

test: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadfile tests

# Run every example of README.md and docs/*.md and rewrite the output each shows (tests/test_docs.py checks them).
docs: $(STAMP)
	$(PY) tests/docs_refresh.py

bench: $(STAMP)
	for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks

clean:
	rm -rf $(VENV) out .pytest_cache .ruff_cache
