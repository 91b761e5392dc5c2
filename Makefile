# polnet: `make demo` runs a whole local network, `make test` runs the tests.
# Both set themselves up (venv, pip, npm) on a fresh machine.

PY       ?= python3
VENV     := .venv
BIN      := $(VENV)/bin
PYTEST_ARGS ?= --durations=12

.PHONY: demo demo-collab test setup browser nat-tools lint typecheck contracts bench clean devnet-up devnet-down

setup: $(VENV)/.installed node_modules/.installed

# torch is pinned to 2.13.0 (a CPU build of it lies on disk here); a looser pin
# would download a multi-GB CUDA build. requirements.lock pins the rest.
$(VENV)/.installed: pyproject.toml requirements.lock
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c requirements.lock "torch==2.13.0"
	$(BIN)/pip install --quiet -c requirements.lock -e ".[dev]"
	touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

demo: setup
	$(BIN)/polnet demo

demo-collab: setup
	$(BIN)/polnet demo --collab

# Three parts, all always run: the long tests that mostly wait on other processes
# (marker `parallel`: real daemons, a second EVM) three at a time; then the rest two at
# a time (each pytest-xdist worker has its own anvil); then the few whose own deadlines
# are tight against the wall clock (marker `serial`: the chaos run, a collaborative
# e2e's rounds, a juror's vote window beside a slow provider) one at a time.
# Exit 5 (nothing selected, e.g. under -k) is not a failure unless every part says it.
test: setup browser nat-tools
	@$(BIN)/python -m pytest -m parallel -n 3 --dist worksteal $(PYTEST_ARGS); a=$$?; \
	$(BIN)/python -m pytest -m "not parallel and not serial" -n 2 --dist worksteal $(PYTEST_ARGS); b=$$?; \
	$(BIN)/python -m pytest -m serial $(PYTEST_ARGS); c=$$?; \
	for rc in $$a $$b $$c; do [ $$rc -eq 0 ] || [ $$rc -eq 5 ] || exit $$rc; done; \
	[ $$a -ne 5 ] || [ $$b -ne 5 ] || [ $$c -ne 5 ] || exit 5

# tests/test_explorer.py renders pages in headless Chromium (Debian's package); the
# tests skip it where Chromium is missing, so `make test` installs it or fails.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  (DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null || \
	   (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium)) || \
	  (echo "make test needs Chromium for tests/test_explorer.py: install Debian's" \
	        "package chromium (as root: apt-get install chromium)" >&2; exit 1)

# tests/test_nat.py runs daemons in network namespaces behind nftables NAT (as root);
# it skips, saying why, where it cannot, so `make test` installs nftables or fails.
nat-tools:
	@command -v nft >/dev/null 2>&1 || \
	  (DEBIAN_FRONTEND=noninteractive apt-get install -y -q nftables >/dev/null || \
	   (apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q nftables)) || \
	  (echo "make test needs nftables for tests/test_nat.py: install Debian's" \
	        "package nftables (as root: apt-get install nftables)" >&2; exit 1)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/mypy node verifier devnet tests
	for b in bench/*.py; do $(BIN)/mypy $$b || exit 1; done

contracts: node_modules/.installed
	node contracts/build.mjs

bench: setup
	for b in bench/*.py; do $(BIN)/python $$b || exit 1; done

devnet-up: setup
	$(BIN)/polnet devnet up

devnet-down: setup
	$(BIN)/polnet devnet down

clean:
	rm -rf $(VENV) node_modules .pytest_cache .mypy_cache .ruff_cache
