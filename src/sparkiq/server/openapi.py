"""The OpenAPI 3.1 description of the REST API, served at ``/openapi.json``."""

from __future__ import annotations

from typing import Any

from sparkiq._version import __version__
from sparkiq.server.routes import ROUTES

__all__ = ["openapi_document"]

_ERROR = {"$ref": "#/components/schemas/Error"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    text = {
        400: "Invalid request; `field` names the offending field",
        401: "Missing or wrong bearer token (with `retry_after_seconds`: not checked, as "
        "this address failed too often lately)",
        404: "Unknown store, key or route",
        406: "The Accept header asks for what this answer cannot be (an Arrow stream of a "
        "push query)",
        413: "Request body too large",
        502: "Another node failed while answering",
    }
    return {str(c): _json(_ERROR, text[c]) for c in codes}


_STORE = {"name": "store", "in": "path", "required": True, "schema": {"type": "string"}}
_KEY = {
    "name": "key",
    "in": "path",
    "required": True,
    "description": "The key as text (ISO dates/timestamps, base64 binary); a composite key "
    "as a URL-encoded JSON array",
    "schema": {"type": "string"},
}


def openapi_document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "sparkiq node",
            "version": __version__,
            "description": "Interactive and SQL queries over the live state of PySpark "
            "Structured Streaming pipelines. Every answer carries a position token; pass it "
            "back as `bound` for monotonic reads and read-your-writes.",
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {
                    "type": "object",
                    "properties": {
                        "error": {
                            "type": "object",
                            "required": ["code", "message"],
                            "properties": {
                                "code": {"type": "string"},
                                "message": {"type": "string"},
                                "field": {"type": ["string", "null"]},
                                "line": {"type": "integer"},
                                "column": {"type": "integer"},
                                "snippet": {"type": "string"},
                                "candidates": {"type": "array", "items": {"type": "string"}},
                                "retry_after_seconds": {"type": "number"},
                            },
                        }
                    },
                },
                "Query": {
                    "type": "object",
                    "required": ["type"],
                    "properties": {
                        "type": {
                            "enum": [
                                "key",
                                "range",
                                "window_key",
                                "window_range",
                                "versioned_key",
                                "multi_versioned_key",
                            ]
                        },
                        "key": {"description": "JSON value; array for composite keys"},
                        "lower": {"description": "Inclusive lower key bound"},
                        "upper": {"description": "Inclusive upper key bound"},
                        "order": {"enum": ["any", "ascending", "descending"]},
                        "from": {
                            "type": "string",
                            "description": "Earliest window start (window queries) or commit "
                            "time (multi_versioned_key)",
                        },
                        "to": {
                            "type": "string",
                            "description": "Latest window start (window queries) or commit "
                            "time (multi_versioned_key)",
                        },
                        "as_of": {
                            "type": ["integer", "string"],
                            "description": "versioned_key: a batch id, or an ISO time (the "
                            "batch current then)",
                        },
                        "from_batch": {"type": "integer", "description": "multi_versioned_key"},
                        "to_batch": {"type": "integer", "description": "multi_versioned_key"},
                    },
                },
                "StateQueryRequest": {
                    "type": "object",
                    "required": ["query"],
                    "properties": {
                        "query": {"$ref": "#/components/schemas/Query"},
                        "partitions": {"type": "array", "items": {"type": "integer"}},
                        "bound": {"type": "string", "description": "Position token"},
                        "after": {"$ref": "#/components/schemas/ProducedRecords"},
                        "require_active": {"type": "boolean"},
                        "execution_info": {"type": "boolean"},
                    },
                },
                "ProducedRecords": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 10000,
                    "description": "Read-your-writes: Kafka records a producer sent, as the "
                    "broker acknowledged them; the read waits (bounded) until the table has "
                    "applied them, else NOT_UP_TO_BOUND",
                    "items": {
                        "type": "object",
                        "required": ["topic", "partition", "offset"],
                        "additionalProperties": False,
                        "properties": {
                            "topic": {"type": "string", "minLength": 1},
                            "partition": {"type": "integer", "minimum": 0},
                            "offset": {"type": "integer", "minimum": 0},
                        },
                    },
                },
                "PartitionResult": {
                    "type": "object",
                    "properties": {
                        "position": {"type": "string"},
                        "result": {
                            "description": "Row object or null (key queries); a versioned "
                            "record {value, valid_from, valid_to, valid_from_time, "
                            "valid_to_time} or null (versioned_key); an array of versioned "
                            "records (multi_versioned_key)"
                        },
                        "rows": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {"key": {}, "row": {"type": "object"}},
                            },
                        },
                        "failure": {
                            "type": "object",
                            "properties": {
                                "reason": {
                                    "enum": [
                                        "UNKNOWN_QUERY_TYPE",
                                        "NOT_ACTIVE",
                                        "NOT_UP_TO_BOUND",
                                        "NOT_PRESENT",
                                        "DOES_NOT_EXIST",
                                        "STORE_EXCEPTION",
                                    ]
                                },
                                "message": {"type": "string"},
                            },
                        },
                        "execution_info": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "StateQueryResult": {
                    "type": "object",
                    "properties": {
                        "store": {"type": "string"},
                        "partitions": {
                            "type": "object",
                            "additionalProperties": {
                                "$ref": "#/components/schemas/PartitionResult"
                            },
                        },
                        "position": {"type": "string"},
                    },
                },
                "SqlRequest": {
                    "type": "object",
                    "required": ["sql"],
                    "properties": {
                        "sql": {"type": "string"},
                        "bound": {"type": "string", "description": "Position token"},
                        "after": {"$ref": "#/components/schemas/ProducedRecords"},
                        "page_token": {"type": "string"},
                        "page_size": {"type": "integer"},
                        "from": {"type": "string", "description": "Push: resume after token"},
                        "snapshot": {"type": "boolean", "description": "Push: current rows first"},
                    },
                },
                "SqlResult": {
                    "type": "object",
                    "properties": {
                        "columns": {"type": "array", "items": {"type": "string"}},
                        "rows": {"type": "array", "items": {"type": "object"}},
                        "position": {"type": "string"},
                        "next_page_token": {"type": "string"},
                    },
                },
                "Change": {
                    "type": "object",
                    "description": "One line of a push query's answer (an empty line is a "
                    'keep-alive; a final line may be `{"error": ...}`)',
                    "properties": {
                        "key": {},
                        "row": {"type": ["object", "null"], "description": "null: deleted"},
                        "position": {"type": "string"},
                        "batch_id": {"type": "integer"},
                        "snapshot": {"type": "boolean"},
                    },
                },
            },
        },
        "security": [{"bearer": []}],
        "paths": _paths(),
    }


#: What each route takes and answers, by path and method (the routes themselves, and who may
#: call them, are sparkiq.server.routes'; a public route is marked here as needing no token).
_OPERATIONS: dict[str, dict[str, Any]] = {
    "/": {
        "get": {
            "summary": "The web console (HTML): SQL pull and push queries in a browser",
            "responses": {"200": {"description": "HTML page"}},
        }
    },
    "/healthz": {
        "get": {
            "summary": "Liveness",
            "responses": {"200": {"description": "The process is serving"}},
        }
    },
    "/readyz": {
        "get": {
            "summary": "Readiness: every hosted partition caught up",
            "responses": {
                "200": {"description": "Ready"},
                "503": {"description": "Some partitions are restoring or stuck"},
            },
        }
    },
    "/openapi.json": {
        "get": {
            "summary": "This document",
            "responses": {"200": {"description": "OpenAPI 3.1"}},
        }
    },
    "/metrics": {
        "get": {
            "summary": "Prometheus metrics",
            "responses": {"200": {"description": "Text exposition format"}},
        }
    },
    "/stats": {
        "get": {
            "summary": "This node: queries per table (last 10 minutes, per 5 s), the "
            "gauges the console charts (lag, freshness, the writer's input rate, per 5 s), "
            "progress of every hosted partition (restores), Kafka lag per table, "
            "each table's writer (its Spark query: running, failed with the reason, "
            "stopped, silent; input rows/s, batch duration, last commit)",
            "responses": {"200": {"description": "Stats"}, **_errors(401)},
        }
    },
    "/charts/{store}/{chart}": {
        "get": {
            "summary": "A chart of the table over the last 10 minutes as SVG (what the "
            "console shows): lag (batches), freshness (seconds behind), queries (per second) "
            "or input (the writer's rows per second); the numbers are GET /stats' queries "
            "and gauges",
            "parameters": [
                _STORE,
                {
                    "name": "chart",
                    "in": "path",
                    "required": True,
                    "schema": {"type": "string", "enum": ["lag", "freshness", "queries", "input"]},
                },
                {
                    "name": "minutes",
                    "in": "query",
                    "description": "The newest minutes shown (default all 10)",
                    "schema": {"type": "integer", "minimum": 1, "maximum": 10},
                },
                {
                    "name": "tz_offset",
                    "in": "query",
                    "description": "The time axis's zone, in minutes east of UTC (default 0)",
                    "schema": {"type": "integer", "minimum": -840, "maximum": 840},
                },
            ],
            "responses": {
                "200": {
                    "description": "The chart",
                    "content": {"image/svg+xml": {"schema": {"type": "string"}}},
                },
                **_errors(400, 401, 404),
            },
        }
    },
    "/stores": {
        "get": {
            "summary": "Materialized tables with schema, key columns and partitions",
            "responses": {"200": {"description": "Stores"}, **_errors(401)},
        }
    },
    "/stores/{store}/keys/{key}": {
        "get": {
            "summary": "The current row of one key (routed to the node that hosts it)",
            "parameters": [_STORE, _KEY],
            "responses": {
                "200": _json(
                    {
                        "type": "object",
                        "properties": {
                            "key": {},
                            "row": {"type": "object"},
                            "partition": {"type": "integer"},
                            "position": {"type": "string"},
                        },
                    },
                    "The row",
                ),
                **_errors(400, 401, 404, 502),
            },
        }
    },
    "/stores/{store}/query": {
        "post": {
            "summary": "An IQv2 request; range results are streamed",
            "parameters": [_STORE],
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {"$ref": "#/components/schemas/StateQueryRequest"}
                    }
                },
            },
            "responses": {
                "200": _json(
                    {"$ref": "#/components/schemas/StateQueryResult"},
                    "Per-partition results and the merged position",
                ),
                **_errors(400, 401, 404, 413, 502),
            },
        }
    },
    "/metadata": {
        "get": {
            "summary": "Every node: active and standby partitions, hosted states",
            "responses": {"200": {"description": "Nodes"}, **_errors(401)},
        }
    },
    "/metadata/stores/{store}/keys/{key}": {
        "get": {
            "summary": "The key's partition, active host and standby hosts",
            "parameters": [_STORE, _KEY],
            "responses": {"200": {"description": "Metadata"}, **_errors(400, 401, 404)},
        }
    },
    "/query": {
        "post": {
            "summary": "SQL: a pull query (JSON, or an Arrow IPC stream) or "
            "`... EMIT CHANGES` (NDJSON stream)",
            "parameters": [
                {
                    "name": "accept",
                    "in": "header",
                    "required": False,
                    "description": "`application/vnd.apache.arrow.stream` answers a "
                    "pull query as an Arrow IPC stream (record batches of at most "
                    "16,384 rows; the position in the `sparkiq-position` header); "
                    "anything else, JSON. A push query with the Arrow type is "
                    "refused with 406",
                    "schema": {"type": "string"},
                }
            ],
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/SqlRequest"}}
                },
            },
            "responses": {
                "200": {
                    "description": "The result: JSON, an Arrow IPC stream (when "
                    "asked for with Accept), or for a push query one JSON change "
                    "per line",
                    "headers": {
                        "sparkiq-position": {
                            "description": "Arrow answers only: the position "
                            "token the result was read at",
                            "schema": {"type": "string"},
                        },
                        "sparkiq-next-page-token": {
                            "description": "Arrow answers only, when more rows "
                            "remain: pass it back as `page_token`",
                            "schema": {"type": "string"},
                        },
                    },
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/SqlResult"}},
                        "application/vnd.apache.arrow.stream": {
                            "schema": {"type": "string", "format": "binary"}
                        },
                        "application/x-ndjson": {"schema": {"$ref": "#/components/schemas/Change"}},
                    },
                },
                **_errors(400, 401, 404, 406, 413, 502),
            },
        }
    },
    "/internal/query": {
        "post": {
            "summary": "Node protocol (binary, application/x-sparkiq-v1)",
            "responses": {"200": {"description": "Framed results"}, **_errors(400, 401)},
        }
    },
    "/internal/heartbeat": {
        "post": {
            "summary": "Membership heartbeat (binary)",
            "responses": {"200": {"description": "The receiver's heartbeat"}},
        }
    },
    "/internal/probe": {
        "post": {
            "summary": "Gossip membership probe (binary)",
            "responses": {"200": {"description": "The receiver's ack"}},
        }
    },
    "/internal/probe-req": {
        "post": {
            "summary": "Gossip membership: probe another member for the caller (binary)",
            "responses": {"200": {"description": "Whether the other member acknowledged"}},
        }
    },
}
_OPERATIONS["/console"] = _OPERATIONS["/"]


def _paths() -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for route in ROUTES:
        operation = dict(_OPERATIONS[route.path][route.method.lower()])
        if route.access == "public":
            operation["security"] = []
        paths.setdefault(route.path, {})[route.method.lower()] = operation
    return paths
