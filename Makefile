# The two commands that matter: `make demo` and `make test`. Each creates its virtual
# environments when missing.
#
# .venv        the newest Python found (3.13, then 3.12, on PATH or in pyenv's versions folder,
#              else python3) with the newest releases pyproject.toml allows: `make demo` runs here.
# .venv-oldest Python 3.11 with the oldest supported releases (tools/oldest-pins.txt).
# `make test` runs ruff, then the whole suite in .venv and, in .venv-oldest, the suite without
# the whole-program runs marked `slow` and without the further parameter sets of parametrized
# tests, marked `sweep` (tests/conftest.py says which and why; OLDEST_MARKS= runs them there
# too).
PYTHON        ?= $(shell tools/find-python 3.13 3.12 || command -v python3)
OLDEST_PYTHON ?= $(shell tools/find-python 3.11)
VENV          := .venv
OLD_VENV      := .venv-oldest
BIN           := $(VENV)/bin
OLD_BIN       := $(OLD_VENV)/bin
PYTEST_ARGS   ?= -q -n auto --dist loadfile tests
OLDEST_MARKS  ?= not slow and not sweep

.PHONY: demo test test-newest test-oldest lint format bench clean install versions browser

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e ".[test]"
	touch $@

$(OLD_BIN)/python:
	@test -n "$(OLDEST_PYTHON)" || { echo "make: no Python 3.11 found for the oldest-pins \
	test pass; fix: install Python 3.11 (e.g. pyenv install 3.11) or set OLDEST_PYTHON=/path/to/python3.11"; exit 1; }
	$(OLDEST_PYTHON) -m venv $(OLD_VENV)
	$(OLD_BIN)/python -m pip install --quiet --upgrade pip

$(OLD_VENV)/.installed: $(OLD_BIN)/python pyproject.toml tools/oldest-pins.txt
	$(OLD_BIN)/python -m pip install --quiet -c tools/oldest-pins.txt -e ".[test]"
	touch $@

install: $(VENV)/.installed

versions: $(VENV)/.installed $(OLD_VENV)/.installed
	@$(BIN)/shardkit --version
	@$(OLD_BIN)/shardkit --version

demo: $(VENV)/.installed
	$(BIN)/shardkit train

test: test-newest test-oldest

# The report's browser test needs Chromium: Debian's package, installed here when missing
# (as root, or with passwordless sudo); without it that one test is skipped with the reason.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo "sudo -n"); \
	  { $$SUDO apt-get install -y -q chromium >/dev/null 2>&1 || \
	    { $$SUDO apt-get update -q >/dev/null 2>&1 && \
	      $$SUDO apt-get install -y -q chromium >/dev/null 2>&1; }; } \
	  && echo "make: installed Debian's chromium for the report's browser test" \
	  || echo "make: could not install chromium (apt-get); the browser test is skipped"; }

test-newest: browser $(VENV)/.installed
	$(BIN)/ruff check src tests examples benchmarks
	@echo "== newest: $$($(BIN)/shardkit --version)"
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-oldest: browser $(OLD_VENV)/.installed
	@echo "== oldest pins: $$($(OLD_BIN)/shardkit --version)"
	$(OLD_BIN)/python -m pytest -m "$(OLDEST_MARKS)" $(PYTEST_ARGS)

lint: $(VENV)/.installed
	$(BIN)/ruff check src tests examples benchmarks
	$(BIN)/ruff format --check src tests examples benchmarks

format: $(VENV)/.installed
	$(BIN)/ruff format src tests examples benchmarks
	$(BIN)/ruff check --fix src tests examples benchmarks

bench: $(VENV)/.installed
	for f in benchmarks/*.py; do $(BIN)/python $$f || exit 1; done

clean:
	rm -rf $(VENV) $(OLD_VENV) build dist *.egg-info src/*.egg-info .pytest_cache .ruff_cache
