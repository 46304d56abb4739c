# Each target sets itself up: a .venv made and filled from pyproject.toml, reused when present.
PY := .venv/bin/python
STAMP := .venv/.installed

.PHONY: demo test lint typecheck bench clean

$(STAMP): pyproject.toml
	python3 -m venv .venv
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	RAY_USAGE_STATS_ENABLED=0 $(PY) -m car_ray.cli demo

lint: $(STAMP)
	.venv/bin/ruff check car_ray tests benchmarks jobs
	.venv/bin/ruff format --check car_ray tests benchmarks jobs

typecheck: $(STAMP)
	.venv/bin/mypy --strict car_ray

# pytest's exit 5 means it collected no test: that is a failure, not a pass.
test: lint typecheck
	RAY_USAGE_STATS_ENABLED=0 .venv/bin/pytest -q -n 2 --dist loadfile tests; s=$$?; \
	if [ $$s -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$s

bench: $(STAMP)
	$(PY) benchmarks/fork_overhead.py
	$(PY) benchmarks/throughput.py
	$(PY) benchmarks/accuracy.py --quick

clean:
	rm -rf .venv .mypy_cache .ruff_cache .pytest_cache
