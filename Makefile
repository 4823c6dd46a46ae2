# Two commands a user needs: `make demo` and `make test`. Each creates .venv when missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-hosts lint typecheck unit bench clean jvm-jars

# The demo needs sparkiq alone; the tests need the dev extra on top (test clients, a Kafka
# client, ruff, mypy...), which takes minutes to install. A venv that has the dev extra
# already serves the demo as it is.
RUNTIME_STAMP := $(VENV)/.installed-runtime

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP) $(RUNTIME_STAMP)

$(RUNTIME_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	touch $(RUNTIME_STAMP)

demo: $(RUNTIME_STAMP)
	$(BIN)/sparkiq demo $(DEMO_ARGS)

test: lint typecheck unit

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

# The JVM artifacts the tests run (a Kafka broker, Spark's Kafka connector, pgJDBC, Arrow's
# Flight SQL JDBC driver), pinned in jvm/ and copied from Maven Central into .jvm/<module>/
# (git ignores it); redone when a pom changes. See docs/design.md ("Kafka: a real broker and
# Spark's connector", "A JDBC driver as a real client").
JVM_STAMP := .jvm/.fetched
JVM_POMS := jvm/pom.xml jvm/kafka-broker/pom.xml jvm/spark-kafka/pom.xml jvm/pg-jdbc/pom.xml \
	jvm/flight-jdbc/pom.xml

$(JVM_STAMP): $(JVM_POMS)
	rm -rf .jvm/kafka-broker .jvm/spark-kafka .jvm/pg-jdbc .jvm/flight-jdbc
	mvn -q -B -Dstyle.color=never -f jvm/pom.xml dependency:copy-dependencies
	touch $(JVM_STAMP)

jvm-jars: $(JVM_STAMP)

# A class-data-sharing archive of what a Spark driver loads: every Spark JVM the tests start
# maps it instead of loading those classes again, a third less CPU each (built once, about
# 20 CPU-seconds; see tests/spark/class_archive.py). Rebuilt when PySpark is reinstalled.
CLASS_ARCHIVE := .jvm/spark-classes.jsa

$(CLASS_ARCHIVE): $(STAMP) tests/spark/class_archive.py tests/spark/writer_process.py \
		tests/spark/short_jvm.py
	$(BIN)/python -m tests.spark.class_archive

# Whole files go to each worker (--dist loadfile): a file's module fixtures (a live demo, a
# Spark query) are set up once, and each worker has its own SparkSession. Files go out in
# collection order, which tests/conftest.py makes longest-first (xdist would otherwise sort
# them by their number of tests); tests/kafka and the files that run Spark Connect go to one
# worker together, to share one broker and one Connect server.
# Four workers on two cores: the suite is bound by its CPU work, and the workers beyond two
# fill the cores while a file waits on a trigger or a failure window (docs/design.md, "The
# test suite on four workers"). TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 4

# The tests start hundreds of Python processes (nodes, Spark's Python workers, writers), each
# importing much of sparkiq: compiled once here, they read the bytecode instead of compiling
# the source again, which they would do each time where PYTHONDONTWRITEBYTECODE is set
# (a node's start: 1.0 -> 0.7 CPU-seconds). Only changed files are compiled again.
#
# Where Debian's eatmydata is installed (.ci/run installs it), the tests run under it: fsync
# returns at once. Nothing a test can check needs it (a killed process loses nothing the page
# cache holds; only a lost machine would), and under load the changelog's, RocksDB's and
# Kafka's syncs made tests wait on the disk (docs/design.md, "The test suite on three
# workers"). The benchmarks run without it: they measure what a user's machine does.
EATMYDATA := $(shell command -v eatmydata 2>/dev/null)

unit: $(STAMP) $(JVM_STAMP) $(CLASS_ARCHIVE)
	$(BIN)/python -m compileall -q src tests bench
	$(EATMYDATA) $(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not hosts" \
		$(PYTEST_ARGS)

# A cluster on hosts of a real network (Linux network namespaces, iproute2; needs root):
# three TLS nodes, clients on a fourth host, links cut, a clock skewed, a host restarted,
# judged by tests/faults' history checker. Minutes, so left out of `make test`, which runs
# only the network's own test (tests/hosts/test_network.py). See docs/cluster.md.
test-hosts: $(STAMP)
	$(BIN)/pytest -s tests/hosts $(PYTEST_ARGS)

# BENCH_ARGS=--smoke runs every benchmark in its smallest form (what `make test` checks),
# --quick a shorter run, --only NAMES a subset; see `python -m bench.run_all --help`.
bench: $(STAMP)
	$(BIN)/python -m bench.run_all $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .jvm
