# Two entry points for a fresh machine: `make demo` and `make test`.
# Both create .venv and install the exact environment from constraints.txt.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# clkhash declares cryptography<41, which the project's cryptography 50 does not meet; it uses
# only HKDF (same API): installed without its declared dependencies (the `linkage` extra has the
# others), tests/linkage checks its encodings against ones made under cryptography 40.
CLKHASH := clkhash==0.18.3
# Debian packages: WeasyPrint's HarfBuzz subsetter (the PDF report, `make demo`); for the
# tests also poppler (pdftotext, pdftoppm), Chromium, which loads the HTML report headless,
# and R with survival and cmprsk, whose Rscript is the live oracle of the survival fits
# (tests/fedstats/test_r_oracle.py: coxph, survdiff, finegray, crr, cuminc).
REPORT_PACKAGES := libharfbuzz-subset0
R_PACKAGES      := r-base-core r-cran-survival r-cran-cmprsk
SYSTEM_PACKAGES := $(REPORT_PACKAGES) poppler-utils chromium $(R_PACKAGES)

# Install the Debian packages named in $(1) that are missing (as root, e.g. in CI).
define install_debian
	@missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
endef

.PHONY: demo test lint lab system-packages report-packages constraints clean

demo: $(STAMP) report-packages
	$(VENV)/bin/fedstats demo

test: $(STAMP) system-packages
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -n 2 --dist loadgroup

# JupyterLab on notebooks/, its Python kernel this environment's (JUPYTER_PATH first, so a
# "python3" kernel installed for the user or system cannot take its place). As root (e.g. in
# a container) JupyterLab must be told that this is intended.
lab: $(STAMP)
	JUPYTER_PATH=$(CURDIR)/$(VENV)/share/jupyter $(VENV)/bin/jupyter lab --notebook-dir=notebooks \
	  $(if $(filter 0,$(shell id -u)),--allow-root)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff format --check .

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --constraint constraints.txt torch==2.13.0
	$(PY) -m pip install --quiet --disable-pip-version-check --constraint constraints.txt --editable '.[test,deep,notebook,simulation,linkage]'
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps $(CLKHASH)
	touch $(STAMP)

system-packages:
	$(call install_debian,$(SYSTEM_PACKAGES))

report-packages:
	$(call install_debian,$(REPORT_PACKAGES))

# Regenerate the exact constraints from the current environment (after changing pyproject.toml).
constraints: $(STAMP)
	{ echo "# Exact versions every machine installs (pip install -c constraints.txt)."; \
	  echo "# Regenerate with: make constraints (after changing pyproject.toml)."; \
	  $(PY) -m pip freeze --exclude-editable | sed 's/^torch==2.13.0+cpu$$/torch==2.13.0/'; } > constraints.txt

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
