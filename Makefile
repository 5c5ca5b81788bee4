# Both targets build and reuse .venv on their own; a machine needs only Python 3.11+.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint typecheck bench screenshots clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[asgi,wsgi,postgres,demo,console]' --group dev
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m keyturn.demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy src

test: lint typecheck
	$(BIN)/python -m pytest --cov --cov-report=term $(PYTEST_ARGS)

screenshots: $(STAMP)
	$(BIN)/python -m tests.console.screenshots

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache .coverage .hypothesis
