# Both targets build and reuse .venv on their own; a machine needs only Python 3.11+.
# `make demo` installs what the demo needs; `make test` adds every extra and the dev group.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
DEMO_STAMP := $(VENV)/.demo-installed
DOCS_STAMP := $(VENV)/.docs-installed
STAMP  := $(VENV)/.installed
# A failed install removes the half-built .venv, so the next make starts clean.
INSTALL = || { rm -rf $(VENV); echo "make: the install failed; .venv was removed, run make again" >&2; exit 1; }

# The compiled build (hatch_build.py, mypyc) has a venv of its own; it needs a C compiler.
CVENV  := .venv-compiled
CBIN   := $(CVENV)/bin
CDEPS  := $(CVENV)/.dependencies
CSTAMP := $(CVENV)/.compiled
CINSTALL = || { rm -rf $(CVENV); echo "make: the compiled install failed; $(CVENV) was removed" >&2; exit 1; }

.PHONY: demo docs test test-pure test-compiled lint typecheck bench screenshots clean python-version

python-version:
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  echo "make: keyturn needs Python 3.11 or newer; '$(PYTHON)' is $$($(PYTHON) -V 2>/dev/null || echo 'not found')." >&2; \
	  echo "      Install one and pass it: make $(MAKECMDGOALS) PYTHON=python3.12" >&2; exit 1; }

$(VENV)/bin/python: | python-version
	$(PYTHON) -m venv $(VENV) $(INSTALL)

$(DEMO_STAMP): pyproject.toml | $(VENV)/bin/python
	$(BIN)/python -m pip install --quiet -e '.[demo]' $(INSTALL)
	touch $(DEMO_STAMP)

$(STAMP): pyproject.toml | $(VENV)/bin/python
	$(BIN)/python -m pip install --quiet --upgrade pip $(INSTALL)
	$(BIN)/python -m pip install --quiet -e '.[asgi,wsgi,postgres,demo,console,django,fastapi,client]' --group dev $(INSTALL)
	touch $(STAMP) $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/python -m keyturn.demo

# The docs site, into site/: strict, so a warning, a broken link or anchor fails the build.
# The docs group needs no keyturn install: the API reference reads src/ as source.
$(DOCS_STAMP): pyproject.toml | $(VENV)/bin/python
	$(BIN)/python -m pip install --quiet --upgrade pip $(INSTALL)
	$(BIN)/python -m pip install --quiet --group docs $(INSTALL)
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy src

# Both builds run the whole suite: the pure-Python package (the reference), then the
# compiled one, unless KEYTURN_SKIP_COMPILED=1 or the machine has no C compiler.
test: docs test-pure
	@if [ -n "$$KEYTURN_SKIP_COMPILED" ]; then echo "make: compiled build skipped (KEYTURN_SKIP_COMPILED)"; \
	elif ! command -v "$${CC:-cc}" >/dev/null 2>&1; then echo "make: no C compiler: compiled build skipped"; \
	else $(MAKE) --no-print-directory test-compiled; fi

test-pure: lint typecheck
	$(BIN)/python -m pytest --cov --cov-report=term $(PYTEST_ARGS)

$(CDEPS): pyproject.toml | python-version
	rm -rf $(CVENV)
	$(PYTHON) -m venv $(CVENV) $(CINSTALL)
	$(CBIN)/python -m pip install --quiet --upgrade pip $(CINSTALL)
	$(CBIN)/python -m pip install --quiet '.[asgi,wsgi,postgres,demo,console,django,fastapi,client]' --group dev hatchling setuptools $(CINSTALL)
	touch $(CDEPS)

# Reinstalled, compiled, whenever a source file changes (a wheel, not the source tree).
$(CSTAMP): $(CDEPS) hatch_build.py $(wildcard src/keyturn/*.py)
	KEYTURN_COMPILE=1 $(CBIN)/python -m pip install --quiet --no-build-isolation --no-deps --force-reinstall . $(CINSTALL)
	touch $(CSTAMP)

test-compiled: $(CSTAMP)
	KEYTURN_TEST_COMPILED=1 $(CBIN)/python -m pytest -p no:cacheprovider $(PYTEST_ARGS)

screenshots: $(STAMP)
	$(BIN)/python -m tests.console.screenshots

# Both builds: the compiled one is built first where a C compiler is present.
bench: $(STAMP)
	@if command -v "$${CC:-cc}" >/dev/null 2>&1; then $(MAKE) --no-print-directory $(CSTAMP); \
	else echo "make: no C compiler: the benchmarks measure the pure-Python build only"; fi
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) $(CVENV) build .mypy_cache .pytest_cache .ruff_cache .coverage .hypothesis
