"""sparkiq.spark.failures: the reason kept from the text of a failed query's exception, for
each shape Spark's text takes (tests/kafka/test_kafka_failures.py and
tests/spark/test_standalone.py check it on real failures). The texts below are cut down from
ones Spark 4 printed, their frames kept."""

from __future__ import annotations

from sparkiq.spark.failures import MAX_REASON, failure_reason, query_failed, worker_hint

PREFIX = (
    "[STREAM_FAILED] Query [id = 4f1c, runId = 5efb] terminated with exception: "
    "[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function in "
    "foreach batch sink. Reason: An exception was raised by the Python Proxy. Return Message: "
)
FRAMES = (
    "Traceback (most recent call last):\n"
    '  File "/venv/py4j/clientserver.py", line 644, in _call_proxy\n'
    "    return_value = getattr(self.pool[obj_id], method)(*params)\n"
    '  File "/src/sparkiq/spark/sink.py", line 127, in __call__\n'
    "    .collect()\n"
)

# a source failed on an executor: Py4J quotes the Java exception under the sink's traceback
KAFKA = (
    PREFIX
    + FRAMES
    + "py4j.protocol.Py4JJavaError: An error occurred while calling o238.collectToPython.\n"
    ": org.apache.spark.sql.kafka010.KafkaIllegalStateException: Some data may have been lost.\n"
    "Reason: Could not read records in offset [14, 31) for topic partition orders-1\n"
    "\tat org.apache.spark.sql.kafka010.KafkaExceptions$.couldNotReadOffsetRange(K.scala:94)\n"
    "\tat org.apache.spark.sql.kafka010.consumer.KafkaDataConsumer.get(K.scala:398)\n"
    "Caused by: org.apache.kafka.clients.consumer.OffsetOutOfRangeException: Fetch position 14 "
    "is out of range for partition orders-1\n"
    "\tat org.apache.kafka.clients.consumer.internals.FetchCollector.handle(F.java:1)\n"
    "\t... 34 more\n"
    "\n\nJVM stacktrace:\norg.apache.spark.sql.streaming.StreamingQueryException: ...\n"
    "Caused by: something only the JVM's appendix says\n"
)

# the sink's own error on an executor: a Python worker's traceback inside Spark's job error
SEGMENT = (
    PREFIX
    + FRAMES
    + "py4j.protocol.Py4JJavaError: An error occurred while calling o91.collectToPython.\n"
    ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 3.0 "
    "failed 1 times, most recent failure: Lost task 0.0 in stage 3.0 (TID 5): "
    "org.apache.spark.api.python.PythonException: "
    + FRAMES
    + "sparkiq.errors.CorruptSegmentError: segment '/s/00001.arrow' of batch 1 did not land "
    "where it was written\n"
    "\n\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(B.scala:1)\n"
)


def test_a_java_failure_quoted_by_py4j_keeps_its_message_and_causes() -> None:
    assert failure_reason(KAFKA) == (
        "org.apache.spark.sql.kafka010.KafkaIllegalStateException: Some data may have been lost.\n"
        "Reason: Could not read records in offset [14, 31) for topic partition orders-1\n"
        "Caused by: org.apache.kafka.clients.consumer.OffsetOutOfRangeException: Fetch "
        "position 14 is out of range for partition orders-1"
    )


def test_a_python_failure_on_an_executor_is_the_innermost_exception() -> None:
    assert failure_reason(SEGMENT) == (
        "sparkiq.errors.CorruptSegmentError: segment '/s/00001.arrow' of batch 1 did not land "
        "where it was written"
    )


def test_a_text_without_a_traceback_loses_only_sparks_prefix_and_frames() -> None:
    text = "[STREAM_FAILED] Query [id = a, runId = b] terminated with exception: disk full\n"
    assert failure_reason(text + "\tat org.apache.X.y(X.java:1)\n") == "disk full"
    assert failure_reason(ValueError("odd")) == "odd"
    long = "x" * (MAX_REASON + 10)
    assert failure_reason(long) == "x" * (MAX_REASON - 3) + "..."


def test_the_error_names_the_table_and_where_it_stays() -> None:
    error = query_failed("totals", RuntimeError(KAFKA), committed=4)
    assert error.store == "totals"
    assert str(error).startswith(
        "the Spark query of 'totals' failed: org.apache.spark.sql.kafka010."
    )
    assert "The table stays at batch 4 " in str(error)
    never_committed = query_failed("t", RuntimeError("x"), committed=-1)
    assert "The table stays empty (no batch committed) " in str(never_committed)


def test_a_worker_that_cannot_run_the_sink_names_the_fix() -> None:
    """Spark Connect runs foreachBatch in the server's Python: a Python without sparkiq, or
    one too slow to connect back in Spark's 10 s, gets told what to set."""
    missing = (
        "Traceback (most recent call last):\n  File x\n"
        "ModuleNotFoundError: No module named 'sparkiq'"
    )
    error = str(query_failed("t", RuntimeError(missing), committed=-1))
    assert "has no sparkiq" in error and "PYSPARK_PYTHON" in error
    slow = "[PYTHON_WORKER_FAILED] Python worker failed to connect back."
    assert "sparkiq-worker-python" in str(query_failed("t", RuntimeError(slow), committed=2))
    assert worker_hint(RuntimeError(KAFKA)) is None
    assert worker_hint("Python worker failed to connect back") is not None


# a batch collected on the driver (the sink's small batches: toArrow) that a source failed:
# Spark wraps the job's failure in "Exception thrown in awaitResult"
AWAIT = (
    PREFIX
    + FRAMES
    + "py4j.protocol.Py4JJavaError: An error occurred while calling o412.getResult.\n"
    ": org.apache.spark.SparkException: Exception thrown in awaitResult:\n"
    "\tat org.apache.spark.util.SparkThreadUtils$.awaitResult(SparkThreadUtils.scala:56)\n"
    "Caused by: org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in "
    "stage 45.0 failed 1 times, most recent failure: Lost task 0.0: "
    "org.apache.spark.sql.kafka010.KafkaIllegalStateException: Some data may have been lost.\n"
    "\tat org.apache.spark.scheduler.DAGScheduler.failJobAndIndependentStages(D.scala:1)\n"
    "Caused by: org.apache.spark.sql.kafka010.KafkaIllegalStateException: Some data may have "
    "been lost because they are not available in Kafka any more;\n"
    "If you don't want your streaming query to fail on such cases, set the source option "
    "failOnDataLoss to false.\n"
    "Reason: Could not read records in offset [26, 49) for topic partition orders-0\n"
    "\tat org.apache.spark.sql.kafka010.KafkaExceptions$.couldNotReadOffsetRange(K.scala:94)\n"
    "Caused by: org.apache.kafka.clients.consumer.OffsetOutOfRangeException: Fetch position "
    "26 is out of range for partition orders-0\n"
    "\tat org.apache.kafka.clients.consumer.internals.FetchCollector.handle(F.java:1)\n"
)


def test_a_failure_collected_on_the_driver_is_its_root_cause() -> None:
    reason = failure_reason(AWAIT)
    assert reason.startswith("org.apache.spark.sql.kafka010.KafkaIllegalStateException: ")
    assert "Reason: Could not read records in offset [26, 49) for topic partition orders-0" in (
        reason
    )
    assert "failOnDataLoss to false" in reason and "\tat " not in reason
