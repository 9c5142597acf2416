"""Constraints of the unimesh API that JSON Schema cannot state, for schemathesis.

A hook may touch negative cases too; it only changes values the schema allows either way.
"""
import schemathesis


@schemathesis.hook("map_body")
def backoff_initial_within_max(context, body):
    """`backoff.initialMs` must not exceed `backoff.maxMs` (default 60000): a relation
    between two fields, refused with 400 by the server and documented in the schema."""
    op = context.operation
    if op is None or op.method.upper() != "PUT" or not op.path.startswith("/v1/subscriptions/"):
        return body
    if not isinstance(body, dict) or not isinstance(body.get("backoff"), dict):
        return body
    b = body["backoff"]
    # Absent or null members take their defaults: initialMs 1000, maxMs 60000.
    initial = b.get("initialMs")
    maximum = b.get("maxMs")
    initial = 1000 if initial is None else initial
    maximum = 60000 if maximum is None else maximum
    if isinstance(initial, int) and isinstance(maximum, int) and not isinstance(initial, bool) \
            and not isinstance(maximum, bool) and initial > maximum:
        b["initialMs"] = maximum
    return body
