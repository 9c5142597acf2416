"""Constraints of the unimesh API that JSON Schema cannot state, for schemathesis.

`before_call` runs before every request of every phase (coverage included, which
`map_body` does not reach); only positive (schema-valid) cases are adjusted, so a negative
case stays as invalid as it was generated.
"""
import schemathesis


def _positive(case):
    meta = getattr(case, "meta", None)
    try:
        return meta is not None and meta.generation.mode.is_positive
    except AttributeError:
        return False


def _int(v):
    """An integer as JSON Schema counts them: 5 or 5.0."""
    if isinstance(v, bool):
        return False
    return isinstance(v, int) or (isinstance(v, float) and v.is_integer())


@schemathesis.hook
def before_call(context, case, kwargs):
    """`backoff.initialMs` must not exceed `backoff.maxMs` when both are given: a relation
    between two fields, refused with 400 by the server and stated in the schema's text."""
    op = case.operation
    if op.method.upper() != "PUT" or not op.path.startswith("/v1/subscriptions/"):
        return
    if not _positive(case):
        return
    body = case.body
    if not isinstance(body, dict) or not isinstance(body.get("backoff"), dict):
        return
    b = body["backoff"]
    initial, maximum = b.get("initialMs"), b.get("maxMs")
    if _int(initial) and _int(maximum) and initial > maximum:
        b["initialMs"] = maximum
