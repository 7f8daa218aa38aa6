# Two entry points: `make reproduce` and `make test`. Each creates .venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
OUT ?= results

.PHONY: reproduce test install bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[all]'
	touch $@

install: $(VENV)/.installed

reproduce: $(VENV)/.installed
	$(VENV)/bin/targetpo reproduce --out $(OUT)

test: $(VENV)/.installed
	$(PY) -m pytest -q

bench: $(VENV)/.installed
	$(PY) benchmarks/objectives.py --write BENCHMARKS.md
	$(PY) benchmarks/tokens.py --threads 1 --write BENCHMARKS.md

clean:
	rm -rf $(VENV) $(OUT)
