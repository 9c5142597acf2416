//! JSON numbers as the API's clients write them, shared by every decoder of a request
//! body (the HTTP routes and the subscription document).

/// Turns every number written with a zero fraction (`5.0`, `1e3`) into the integer it is,
/// so an integer field takes it: JSON Schema (and so the OpenAPI document) counts `5.0` as
/// an integer, and a client's JSON encoder may well write one that way.
pub fn integral_floats(v: &mut serde_json::Value) {
    use serde_json::{Number, Value};
    match v {
        Value::Number(n) if n.is_f64() => {
            if let Some(i) = n.as_f64().and_then(integral) {
                *n = i;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(integral_floats),
        Value::Object(members) => members.values_mut().for_each(integral_floats),
        _ => {}
    }
    fn integral(f: f64) -> Option<Number> {
        // 2^63 and 2^64 are exact in f64; every integral f64 below them converts exactly.
        const TWO_63: f64 = 9_223_372_036_854_775_808.0;
        if !f.is_finite() || f.fract() != 0.0 {
            return None;
        }
        if (-TWO_63..TWO_63).contains(&f) {
            Some(Number::from(f as i64))
        } else if (0.0..2.0 * TWO_63).contains(&f) {
            Some(Number::from(f as u64))
        } else {
            None
        }
    }
}
