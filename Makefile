# The two commands: `make demo` (the bridge on a throwaway local Synapse with
# the bundled examples) and `make test` (the whole suite).  Both build .venv.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench venv clean system-packages

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

# The suite starts its own PostgreSQL server (the store's second backend) and
# HAProxy (in front of a leader and its standby): both from Debian's packages,
# installed once when missing.
system-packages:
	@{ ls /usr/lib/postgresql/*/bin/initdb || command -v initdb; } >/dev/null 2>&1 \
	  || { apt-get install -y -qq postgresql >/dev/null 2>&1 \
	       || { apt-get update -qq && apt-get install -y -qq postgresql >/dev/null; }; }
	@command -v haproxy >/dev/null 2>&1 \
	  || { apt-get install -y -qq haproxy >/dev/null 2>&1 \
	       || { apt-get update -qq && apt-get install -y -qq haproxy >/dev/null; }; }
	@command -v ffprobe >/dev/null 2>&1 \
	  || { apt-get install -y -qq --no-install-recommends ffmpeg >/dev/null 2>&1 \
	       || { apt-get update -qq && apt-get install -y -qq --no-install-recommends ffmpeg >/dev/null; }; }

# In two processes (the 2 cores it is sized for), each taking whole test
# files (a module's servers are started once): most of an integration test is
# waiting on Synapse, PostgreSQL or the bridge, so one process left a core idle.
test: $(STAMP) system-packages
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

demo: $(STAMP)
	$(BIN)/python -m bridge.demo

bench: $(STAMP) system-packages
	$(BIN)/pip install --quiet matplotlib
	$(BIN)/python benchmarks/run_all.py $(BENCH_ARGS)
	$(BIN)/python benchmarks/postgres.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .demo build dist *.egg-info
