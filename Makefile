# Corvid: two commands on a fresh machine.
#   make demo   sets everything up and runs the main job
#   make test   sets everything up and runs the test suite
# Also: make doc builds the API docs with rustdoc warnings (broken links) as errors.
# Every target runs scripts/bootstrap.sh first (idempotent, well under 5 s when done).

SHELL := /bin/bash
CARGO ?= cargo

.PHONY: all bootstrap build release test doc demo bench lint fmt

all: build

bootstrap:
	@./scripts/bootstrap.sh

build: bootstrap
	$(CARGO) build --workspace --bins

release: bootstrap
	$(CARGO) build --release --bin corvid

# Binaries first: the end-to-end tests run the real `corvid` binary.
test: bootstrap
	$(CARGO) build --workspace --bins
	$(CARGO) test --workspace

# Overrides .cargo/config.toml's build.rustdocflags, which only matter to doctests.
doc: bootstrap
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps

demo: release
	@./scripts/demo.sh

bench: release
	./target/release/corvid bench ingest --tokens 1000000 --json

lint: bootstrap
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	# The toolbox and its shell grammar: a separate wasm32-wasip1 project, outside the workspace.
	cd sandbox/toolbox && $(CARGO) fmt --all -- --check
	cd sandbox/toolbox && $(CARGO) clippy --locked --release --target wasm32-wasip1 \
		--target-dir ../../target/toolbox-lint --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all
	cd sandbox/toolbox && $(CARGO) fmt --all
