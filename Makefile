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
bench:
	for b in benchmarks/*.py; do .venv/bin/python $$b || exit 1; done
fuzz:
	.venv/bin/python -m pytest -q tests/fuzz --hypothesis-profile=long
