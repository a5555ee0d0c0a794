# longhaul — the two commands: `make dev` (run the whole system locally) and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
SUB ?= alice
export LONGHAUL_VENV := $(abspath $(VENV))

.PHONY: dev test test-unit lint lint-tools token stop venv build-tools build bench-tools bench bench-jobs bench-faults bench-volume bench-tenants bench-build bench-coldstart clean-local

## Start the whole system locally (API on http://127.0.0.1:3000). Ctrl-C stops it.
dev: venv
	cargo build -p longhaul-local
	./target/debug/longhaul-local dev

## Run every test against the local stack (each test binary starts its own stack).
test: venv
	RUST_TEST_THREADS=8 cargo test --workspace

## The fast tier: every crate's unit, property and doc tests, and the local stack's own unit
## tests — no emulator, no venv. Leaves out only the end-to-end binaries in tests/tests/.
test-unit:
	cargo test --workspace --lib --bins
	cargo test --workspace --doc

## Lint the template (cfn-lint, sam validate --lint, checkov) and the Rust code (rustfmt, clippy).
## checkov must find nothing: a finding is fixed, or skipped in the template with its reason
## (`Metadata: checkov: skip: [{id, comment}]` on the resource); a skip without one fails.
lint: venv lint-tools
	cargo fmt --all --check
	$(VENV)/bin/cfn-lint template.yaml
	SAM_CLI_TELEMETRY=0 $(VENV)/bin/sam validate --lint --template template.yaml
	$(VENV)/checkov/bin/checkov -f template.yaml --framework cloudformation --quiet --compact --skip-download
	@awk '/^ *- id: CKV/ { id = $$3; if ((getline line) <= 0 || line !~ /^ *comment: "[^"]+"/) { print "template.yaml:" NR ": checkov skip " id " has no comment"; bad = 1 } } END { exit bad }' template.yaml
	cargo clippy --workspace --all-targets -- -D warnings

## checkov, in a virtualenv of its own inside $(VENV): its pins (boto3 1.35, networkx 2) clash
## with those of aws-sam-cli, cfn-lint and the emulator.
lint-tools: $(VENV)/checkov/.installed
$(VENV)/checkov/.installed: infra/requirements-lint.txt
	$(PYTHON) -m venv $(VENV)/checkov
	$(VENV)/checkov/bin/pip install --quiet --disable-pip-version-check -r infra/requirements-lint.txt
	touch $@

## Print a bearer token for principal SUB (last line of output).
token:
	@cargo build -q -p longhaul-local
	@./target/debug/longhaul-local token $(SUB)

## Stop the emulator left running (it survives a crash of `make dev` on purpose).
stop:
	@cargo build -q -p longhaul-local
	@./target/debug/longhaul-local stop

venv: $(VENV)/.installed
$(VENV)/.installed: infra/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r infra/requirements.txt
	touch $@

build-tools: $(VENV)/.installed-build
$(VENV)/.installed-build: infra/requirements-build.txt $(VENV)/.installed
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r infra/requirements-build.txt
	rustup target add aarch64-unknown-linux-gnu
	touch $@

## Build the deployable artifacts (sam build with cargo-lambda and zig from the virtualenv).
build: build-tools
	PATH="$(abspath $(VENV))/bin:$$PATH" SAM_CLI_TELEMETRY=0 $(VENV)/bin/sam build --no-cached

## What the benchmarks compare against (DuckDB), in the project venv.
bench-tools: $(VENV)/.installed-bench
$(VENV)/.installed-bench: infra/requirements-bench.txt $(VENV)/.installed
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r infra/requirements-bench.txt
	touch $@

## Measure and write BENCHMARKS.md (each benchmark writes a section to target/bench/).
bench: venv bench-tools
	rm -rf target/bench
	cargo run --release -p longhaul-bench --bin csvscan
	cargo run --profile bench-local -p longhaul-bench --bin csvshards
	cargo run --release -p longhaul-bench --bin coldstart
	cargo run --release -p longhaul-bench --bin buildtime
	cargo run --profile bench-local -p longhaul-bench --bin jobs
	cargo run --profile bench-local -p longhaul-bench --bin volume > target/volume-stdout.log
	cargo run --profile bench-local -p longhaul-bench --bin tenants
	tests/bench/assemble

## Re-measure only the jobs section (requests, transitions, $ per job) and rewrite BENCHMARKS.md.
bench-jobs: venv
	cargo run --profile bench-local -p longhaul-bench --bin jobs
	tests/bench/assemble

## The fault checker at 2,000 jobs (LONGHAUL_FAULT_JOBS to resize; `make test` runs 400): writes
## the run's figures (faults injected, jobs handed over, stale writes refused) to BENCHMARKS.md.
bench-faults: venv
	LONGHAUL_FAULT_JOBS=$${LONGHAUL_FAULT_JOBS:-2000} LONGHAUL_FAULT_SECTION=1 \
		cargo test -p longhaul-tests --test faults -- --nocapture
	tests/bench/assemble

## Re-measure only the volume section: the reaper and the expirer over 1,000 / 10,000 / 50,000
## seeded jobs (LONGHAUL_VOLUME_NS to choose); then the reaper over one tenant's waiting backlog,
## 10,000 then 100,000 jobs (LONGHAUL_VOLUME_WAITING, 0 to skip; LONGHAUL_VOLUME_WAITING_RUNNING
## running jobs beside it, 2,000; LONGHAUL_VOLUME_WAITING_BUDGET, 600 s; about 25 minutes of the
## target's 95 on a 2-core machine), failing if a run passes its budget, crowds out the running
## jobs, reports an untrue ActiveJobs count or allocates more as the list grows. The functions'
## metric lines go to a log.
bench-volume: venv
	cargo run --profile bench-local -p longhaul-bench --bin volume > target/volume-stdout.log
	tests/bench/assemble

## Re-measure only the tenants section: a noisy tenant's 500-job backlog against five quiet
## tenants' queue wait (tenant limit 10; LONGHAUL_TENANTS_* to resize), a few minutes.
bench-tenants: venv
	cargo run --profile bench-local -p longhaul-bench --bin tenants
	tests/bench/assemble

## Re-measure only the build-time section: `make build` from a clean checkout of HEAD (several
## minutes; run it on a quiet machine — the section records the load average).
bench-build: venv
	cargo run --release -p longhaul-bench --bin buildtime
	tests/bench/assemble

## Re-measure only the cold-start section: the one Lambda binary's init as each function,
## against a bare lambda_runtime binary.
bench-coldstart:
	cargo run --release -p longhaul-bench --bin coldstart
	tests/bench/assemble

clean-local:
	rm -rf .local
