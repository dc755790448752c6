.PHONY: setup demo test lint bench fuzz
setup:
	bash scripts/setup.sh
demo:
	bash scripts/demo.sh
test:
	bash scripts/test.sh
lint:
	.venv/bin/ruff check src tests benchmarks
	.venv/bin/mypy --strict src/tkbox
	.venv/bin/mypy benchmarks
bench:
	for b in benchmarks/*.py; do .venv/bin/python $$b || exit 1; done
# Each fuzz target runs for FUZZ_SECONDS (rounds of fresh examples); the summary
# prints how many examples each ran. `make fuzz FUZZ_SECONDS=600` for longer.
FUZZ_SECONDS ?= 120
fuzz:
	TKBOX_FUZZ_SECONDS=$(FUZZ_SECONDS) .venv/bin/python -m pytest -q \
		--timeout=0 tests/fuzz --hypothesis-profile=long
