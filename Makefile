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

.PHONY: demo docs test lint typecheck bench screenshots clean python-version

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
	$(BIN)/python -m pip install --quiet -e '.[asgi,wsgi,postgres,redis,demo,console,django,fastapi,client]' --group dev $(INSTALL)
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

test: docs lint typecheck
	$(BIN)/python -m pytest --cov --cov-report=term $(PYTEST_ARGS)

screenshots: $(STAMP)
	$(BIN)/python -m tests.console.screenshots

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) build .mypy_cache .pytest_cache .ruff_cache .coverage .hypothesis
