# boxtrail: `make run` starts the service on ./data; `make test` installs everything and runs the suite.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test fuzz bench bench-ab lint image system-deps clean sdk sourcemap-fixtures sentry-fixtures console-fixtures bench-symbolicate-deps names-fixtures mcp-stdio

# The editable install also builds ingest/_core.c in place (setup.py); an edit to it rebuilds.
$(STAMP): pyproject.toml constraints.txt setup.py ingest/_core.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[dev]'
	touch $@

run: $(STAMP)
	$(PY) -m boxtrail serve

# Debian packages the suite needs: Chromium for the browser tests, PostgreSQL and Redis
# servers for the cluster tests (which start their own, in temp dirs; none is started here),
# podman and debootstrap for the image test (tests/deploy).
system-deps:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null; }
	@command -v redis-server >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }
	@command -v podman >/dev/null 2>&1 && command -v debootstrap >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman debootstrap >/dev/null; }

# The service image (Dockerfile), with Docker or podman: deploy/image.py says how.
image:
	$(PYTHON) deploy/image.py --tag boxtrail:local

# The browser SDK (sdk-js/): npm ci, type-check, node unit tests, then the bundles in dist/.
SDK_STAMP := sdk-js/node_modules/.installed

$(SDK_STAMP): sdk-js/package.json sdk-js/package-lock.json
	cd sdk-js && npm ci --no-audit --no-fund
	touch $@

sdk: $(SDK_STAMP)
	cd sdk-js && npm run typecheck && npm test && npm run build

# Bundlers the source map tests build their bundles with (esbuild, rollup).
SOURCEMAP_STAMP := tests/fixtures/sourcemaps/node_modules/.installed

$(SOURCEMAP_STAMP): tests/fixtures/sourcemaps/package.json tests/fixtures/sourcemaps/package-lock.json
	cd tests/fixtures/sourcemaps && npm ci --no-audit --no-fund
	touch $@

sourcemap-fixtures: $(SOURCEMAP_STAMP)

# The real Sentry clients (@sentry/browser, sentry-cli) the Sentry drop-in tests run.
# package.json denies @sentry/cli's postinstall: the binary comes from @sentry/cli-linux-x64.
SENTRY_STAMP := tests/fixtures/sentry/node_modules/.installed

$(SENTRY_STAMP): tests/fixtures/sentry/package.json tests/fixtures/sentry/package-lock.json
	cd tests/fixtures/sentry && npm ci --no-audit --no-fund
	touch $@

sentry-fixtures: $(SENTRY_STAMP)

# axe-core, the accessibility check the console's browser tests run in the page.
CONSOLE_STAMP := tests/fixtures/console/node_modules/.installed

$(CONSOLE_STAMP): tests/fixtures/console/package.json tests/fixtures/console/package-lock.json
	cd tests/fixtures/console && npm ci --no-audit --no-fund
	touch $@

console-fixtures: $(CONSOLE_STAMP)

# The tools over stdio (mcp-stdio/, the npm package an agent host spawns): its one
# dependency, the official MCP TypeScript SDK.
MCP_STDIO_STAMP := mcp-stdio/node_modules/.installed

$(MCP_STDIO_STAMP): mcp-stdio/package.json mcp-stdio/package-lock.json
	cd mcp-stdio && npm ci --no-audit --no-fund
	touch $@

mcp-stdio: $(MCP_STDIO_STAMP)

# Not part of `make test` (which replays what this records): the function-name matrix of
# tests/fixtures/names recorded again, in every engine this machine can install.
names-fixtures: $(STAMP) system-deps
	@command -v gjs >/dev/null 2>&1 && command -v jsc >/dev/null 2>&1 && command -v firefox-esr >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq gjs libjavascriptcoregtk-4.0-bin firefox-esr >/dev/null; }
	$(PY) tests/fixtures/names/refresh.py

# The large bundle (and the node peer) of benchmarks/bench_symbolicate.py.
BENCH_SYMBOLICATE_STAMP := benchmarks/symbolicate/node_modules/.installed

$(BENCH_SYMBOLICATE_STAMP): benchmarks/symbolicate/package.json benchmarks/symbolicate/package-lock.json
	cd benchmarks/symbolicate && npm ci --no-audit --no-fund
	touch $@

bench-symbolicate-deps: $(BENCH_SYMBOLICATE_STAMP)

# Spark with Iceberg's runtime for benchmarks/bench_iceberg.py, without Maven Central (see
# benchmarks/spark_iceberg.py): pyspark and the runtime jar from PyPI into the venv, and the
# Jackson that jar lacks relocated from pyspark's own with jarjar (Debian libjarjar-java),
# into .bench/ (ignored by git through its own .gitignore).
BENCH_SPARK := .bench/spark
BENCH_SPARK_STAMP := $(BENCH_SPARK)/.installed

$(BENCH_SPARK_STAMP): $(STAMP) benchmarks/spark_iceberg.py
	$(PY) -m pip install --quiet 'pyspark==3.5.9' 'py4j==0.10.9.9' 'snowpark-connect-deps-iceberg==1.0.3'
	@command -v java >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null; }
	@test -f /usr/share/java/jarjar.jar || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libjarjar-java >/dev/null; }
	mkdir -p $(BENCH_SPARK) && echo '*' > .bench/.gitignore
	$(PY) benchmarks/spark_iceberg.py build-jars $(BENCH_SPARK)
	touch $@

.PHONY: bench-spark-deps
bench-spark-deps: $(BENCH_SPARK_STAMP)

# Two workers (the suite mostly waits on servers, browsers and clusters), then the tests
# marked serial alone: their bounds are latencies (under a cut; the console's longest task
# at 2,000 rows/s), which a neighbour's load would move; then 30 s of `make fuzz`. Every
# phase runs; any failing fails the target.
test: $(STAMP) system-deps sdk sourcemap-fixtures sentry-fixtures console-fixtures mcp-stdio
	$(PY) -m pytest -n 2 --dist loadfile -m "not serial"; first=$$?; \
	$(PY) -m pytest -m serial; second=$$?; \
	$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=30; third=$$?; \
	test $$first -eq 0 -a $$second -eq 0 -a $$third -eq 0

# ingest/_core.c built with AddressSanitizer and UBSan (its runtimes preloaded into Python,
# which is not built with them), then the differential tests and a random fuzz for
# FUZZ_SECONDS against that build: any sanitizer report aborts the run.
FUZZ_SECONDS ?= 60
FUZZ_DIR := build/fuzz
fuzz: $(STAMP)
	mkdir -p $(FUZZ_DIR)
	gcc -O1 -g -std=c11 -fPIC -shared -fno-omit-frame-pointer -fsanitize=address,undefined \
		-fno-sanitize-recover=undefined -I"$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" \
		ingest/_core.c -o $(FUZZ_DIR)/_core.so
	LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libubsan.so)" \
		ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:abort_on_error=1 \
		UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 PYTHONMALLOC=malloc \
		$(PY) tests/support/fuzz_core.py $(FUZZ_DIR)/_core.so --seconds $(FUZZ_SECONDS)

lint: $(STAMP)
	$(VENV)/bin/ruff check boxtrail boxtrail_client cluster console core erasure iceberg ingest metadata query symbolicate tenancy usage tests benchmarks deploy
	$(VENV)/bin/mypy

bench: $(STAMP) system-deps sdk bench-symbolicate-deps bench-spark-deps
	$(PY) benchmarks/bench_ingest.py
	$(PY) benchmarks/bench_ingest_inprocess.py
	$(PY) benchmarks/bench_sdk.py
	$(PY) benchmarks/bench_symbolicate.py
	$(PY) benchmarks/bench_query.py
	$(PY) benchmarks/bench_isolation.py
	$(PY) benchmarks/bench_console.py
	$(PY) benchmarks/bench_cluster.py
	$(PY) benchmarks/bench_deletion.py
	$(PY) benchmarks/bench_install.py
	$(PY) benchmarks/bench_iceberg.py

# The code as it is against another commit's, each benchmark alternating between the two
# trees in one run: make bench-ab BASE=<commit>.
bench-ab: $(STAMP) system-deps sdk bench-symbolicate-deps
	$(PY) benchmarks/bench_ab.py --base $(BASE)

clean:
	rm -rf $(VENV) data
