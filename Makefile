# taskloss — the two commands are `make run` and `make test`; both create the environment when missing.
SHELL := /bin/bash
VENV ?= .venv
# Use an existing environment instead of the venv with `make test PY=python` (e.g. inside the conda env).
PY ?= $(VENV)/bin/python
STAMP := $(VENV)/.taskloss-installed
JOBS ?= 2
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]_*.py))
# PyTorch build for `make env` on a machine without torch: empty = `pip install torch==$(TORCH_VERSION)` (a local
# wheel where one is configured, else PyPI's default build, which bundles CUDA on Linux); TORCH=cpu (or cu126,
# cu128, …) installs that build from PyTorch's own wheel index.
TORCH ?=
TORCH_VERSION ?= 2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl
ifeq ($(strip $(TORCH)),)
TORCH_INSTALL := "torch==$(TORCH_VERSION)"
else
TORCH_INSTALL := "torch==$(TORCH_VERSION)+$(TORCH)" --extra-index-url $(TORCH_INDEX)/$(TORCH)
endif
# One BLAS/OpenMP thread per kernel in tests and refreshes: the committed numbers are reproduced exactly.
SERIAL := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
# JupyterLab with the repository's settings (.jupyter/): notebooks/NN_topic.py opens as a notebook.
LAB_ENV := JUPYTER_CONFIG_PATH=$(CURDIR)/.jupyter$${JUPYTER_CONFIG_PATH:+:$$JUPYTER_CONFIG_PATH}

.PHONY: help env env-run guide-outputs run smoke test test-portable test-fast notebooks sync lab lint bench pretrained clean

help:
	@echo "The two commands (both create the environment when it is missing):"
	@echo "  make run        execute every notebook (default parameters) into runs/default/ + SUMMARY.md"
	@echo "  make test       unit tests + pairing + runner tests + every notebook through nbval"
	@echo "Reruns:"
	@echo "  make smoke      every notebook at its smoke parameters (seconds each), claims reported -> runs/smoke/"
	@echo "  make test-portable  make test on an emulated other CPU (one vectorized code path lower)"
	@echo "Notebooks:"
	@echo "  make lab        JupyterLab on localhost (token login), notebooks/*.py open as notebooks;"
	@echo "                  LAB_ARGS=\"--port=8890 --no-browser\" passes options (--allow-root is added as root)"
	@echo "  make notebooks  re-execute notebooks and refresh the committed .ipynb outputs"
	@echo "  make sync       re-pair notebooks/*.py -> .ipynb (keeps outputs)"
	@echo "The book:"
	@echo "  make book       build the notebooks and the package reference into docs/_build/html (EXECUTE=1 reruns)"
	@echo "  make book-check build, then open every page in headless Chromium and test the built site"
	@echo "Other:"
	@echo "  make test-fast  unit tests without the slow ones (no notebooks)"
	@echo "  make guide-outputs  rewrite the outputs shown under the guide's examples from fresh runs"
	@echo "  make lint       ruff on the package (pyflakes, import order, Google-style docstrings)"
	@echo "  make env TORCH=cpu   create the venv with PyTorch's CPU wheel (TORCH=cu128 … for a CUDA build)"
	@echo "  make env-run    only the run set (what make run installs: no test, lab or book packages)"
	@echo "  make bench      run benchmarks/bench_*.py and write benchmarks/RESULTS.md"
	@echo "  make pretrained rebuild the cached pretrained small LM (data/pretrained/)"
	@echo "  make clean      remove runs/ and pytest's cache"

# The environment: a venv with torch installed *first* (see TORCH above; an installed torch is kept unless TORCH
# is given) so that the unpinned torch requirement of the rest is already satisfied and pip never swaps builds.
# Two sets: make run / smoke / notebooks need the run set (the package, its runtime and the peers notebooks execute,
# extra [run]); make test, lab, book, lint and bench the full development set (extra [dev]: test references,
# JupyterLab, Sphinx, ruff). pip shows its progress (the first install downloads a few hundred MB; the dev set
# about 2 GB more).
RUN_STAMP := $(VENV)/.taskloss-run-installed
PIP_VISIBLE := --progress-bar on
define make_venv
	if [ "$(PY)" = "$(VENV)/bin/python" ]; then \
	  test -x $(VENV)/bin/python || python3 -m venv $(VENV); \
	  echo "[make] installing the $(1) set into $(VENV) (pip's progress below) ..."; \
	  $(PY) -m pip install -q --upgrade pip; \
	  if [ -n "$(TORCH)" ] || ! $(PY) -c "import torch" 2>/dev/null; then \
	    $(PY) -m pip install $(PIP_VISIBLE) $(TORCH_INSTALL) || exit 1; \
	  fi; \
	  $(PY) -m pip install $(PIP_VISIBLE) -e ".[$(1)]" || exit 1; \
	  $(PY) -m pip install -q --no-deps "curvlinops-for-pytorch>=3.0.1,<3.1" || exit 1; \
	fi
endef

$(RUN_STAMP): pyproject.toml
	@$(call make_venv,run)
	@if [ "$(PY)" = "$(VENV)/bin/python" ]; then touch $(RUN_STAMP); fi

$(STAMP): pyproject.toml
	@$(call make_venv,dev)
	@if [ "$(PY)" = "$(VENV)/bin/python" ]; then touch $(STAMP) $(RUN_STAMP); fi

env: $(STAMP)

env-run: $(RUN_STAMP)

# JOBS notebooks at a time, one thread each (the two cores of a laptop, no oversubscription): about half the
# serial wall time, the same results (each notebook's numbers are those of a one-thread run, as make test checks).
run: $(RUN_STAMP)
	$(SERIAL) $(PY) -m taskloss.runner all --jobs $(JOBS) --out runs/default

# Every notebook at its smoke parameters (params/NN_topic/smoke.yaml: seconds each): identities asserted, claims
# reported as held or not (a smoke run is not the committed run, so nothing is enforced), SUMMARY.md in runs/smoke.
smoke: $(RUN_STAMP)
	$(SERIAL) $(PY) -m taskloss.runner all --set smoke --jobs $(JOBS) --out runs/smoke

# OMP threads = 1 per worker: two xdist workers share the two cores without oversubscription.
# TASKLOSS_CHECK_HEADLINES: each notebook's fresh headline results must match the committed ones
# (taskloss/results/headlines.py) — nbval's --nbval-lax alone compares no outputs: exactly (rtol 1e-3) where this
# machine computes the same bits as the committed run's, at each headline's cross-machine tolerance elsewhere.
test: $(STAMP)
	$(SERIAL) MPLBACKEND=Agg HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TASKLOSS_CHECK_HEADLINES=1 \
	  $(PY) -m pytest -n $(JOBS) --dist loadfile tests notebooks --nbval-lax --nbval-current-env -p no:cacheprovider

# The same suite on an emulated other CPU: PyTorch, MKL and oneDNN one code path lower than this machine's native one
# (AVX-512 → AVX2, AVX2 → scalar; `python -m taskloss.results.fingerprint --emulate` prints the variables). The
# committed headlines are then checked at their cross-machine tolerances, as on a user's different machine.
test-portable: $(STAMP)
	env $$($(PY) -m taskloss.results.fingerprint --emulate) $(MAKE) --no-print-directory test

test-fast: $(STAMP)
	OMP_NUM_THREADS=1 MPLBACKEND=Agg $(PY) -m pytest -n $(JOBS) tests -m "not slow"

notebooks: $(RUN_STAMP)
	$(SERIAL) $(PY) -m taskloss.runner refresh $(NOTEBOOKS)
	$(PY) docs/expected_results.py

sync: $(RUN_STAMP)
	$(PY) -m jupytext --sync $(NOTEBOOKS)

# Token authentication and localhost only, as JupyterLab defaults: nothing here changes either. Jupyter refuses to
# start as root (the default user of Docker images and rented GPU machines) without --allow-root: it is added only
# when make runs as root. LAB_ARGS passes any other option: make lab LAB_ARGS="--port=8890 --no-browser".
LAB_ARGS ?=
LAB_ROOT := $(if $(filter 0,$(shell id -u)),--allow-root)
lab: $(STAMP)
	$(LAB_ENV) $(PY) -m jupyter lab $(LAB_ROOT) $(LAB_ARGS)

# The outputs shown under the guide's examples (docs/guide/*.md, "Prints:" blocks), rewritten from fresh runs after a
# change that moves a number; tests/docs/test_guide.py compares them.
guide-outputs: $(RUN_STAMP)
	$(SERIAL) HF_HUB_OFFLINE=1 $(PY) docs/guide_outputs.py

lint: $(STAMP)
	$(PY) -m ruff check taskloss

bench: $(STAMP)
	$(PY) benchmarks/run_all.py

pretrained: $(STAMP)
	$(PY) data/build_pretrained_lm.py --force

clean:
	rm -rf runs .pytest_cache

# The book: the committed notebooks (their outputs; EXECUTE=1 executes them instead) and the package reference as
# one static site in docs/_build/html (Sphinx + MyST-NB, docs/conf.py). Warnings are errors: a broken link, an
# unresolved taskloss reference or a markup error in a docstring or notebook fails the build. MathJax is installed
# once from npm into docs/_build/mathjax and served from the site, so the math renders offline (Debian's npm is
# installed here when npm is missing and running as root).
.PHONY: book book-check
EXECUTE ?= 0
BOOK_OUT ?= docs/_build/html
MATHJAX_COPY := docs/_build/mathjax/node_modules/mathjax/es5/tex-chtml.js
book: $(STAMP)
	@$(PY) -c "import sphinx, myst_nb, sphinx_book_theme" 2>/dev/null || $(PY) -m pip install -q -e ".[docs]"
	@[ -n "$$TASKLOSS_MATHJAX" ] || [ -f $(MATHJAX_COPY) ] || command -v npm >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null; \
	  else echo "make book needs npm once (MathJax): apt-get install npm, or set TASKLOSS_MATHJAX" >&2; \
	    exit 2; fi; }
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 MPLBACKEND=Agg TASKLOSS_BOOK_EXECUTE=$(EXECUTE) \
	  $(PY) -m sphinx -b html -W --keep-going -j $(JOBS) -q docs $(BOOK_OUT)
	@echo "The book: open $(BOOK_OUT)/index.html"

# Opens every notebook page and an API page in headless Chromium (Debian's package; installed here when missing and
# running as root) and checks math, figures, links and that nothing was fetched from outside the site; then runs the
# tests of the built site (tests/docs/test_book.py, skipped in `make test`: the build takes minutes) on this site.
book-check: book
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "make book-check needs Chromium: apt-get install chromium" >&2; exit 2; fi; }
	$(PY) docs/check_book.py --site $(BOOK_OUT) --all-notebooks
	TASKLOSS_BOOK_SITE=$(abspath $(BOOK_OUT)) MPLBACKEND=Agg OMP_NUM_THREADS=1 \
	  $(PY) -m pytest tests/docs -q -p no:cacheprovider
