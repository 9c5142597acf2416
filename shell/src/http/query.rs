//! Query parameters: each route names the ones it reads; any other, a repeated one, or a
//! value out of its bounds is a 400 naming the parameter.

use std::collections::BTreeMap;

use super::error::ApiError;

pub struct Query {
    params: BTreeMap<String, String>,
}

impl Query {
    /// Parses `query` (the part after `?`), accepting only the names in `allowed`.
    pub fn parse(query: Option<&str>, allowed: &[&str]) -> Result<Self, ApiError> {
        let mut params = BTreeMap::new();
        for (name, value) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            if !allowed.contains(&name.as_ref()) {
                let known = if allowed.is_empty() {
                    "this route takes no query parameters".to_owned()
                } else {
                    format!("known: {}", allowed.join(", "))
                };
                return Err(ApiError::invalid_query(format!(
                    "unknown query parameter {:?} ({known})",
                    truncate(&name)
                )));
            }
            if params
                .insert(name.to_string(), value.into_owned())
                .is_some()
            {
                return Err(ApiError::invalid_query(format!(
                    "query parameter {name} is given more than once"
                )));
            }
        }
        Ok(Self { params })
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.params.get(name).map(String::as_str)
    }

    /// A required text parameter.
    pub fn required(&self, name: &str) -> Result<&str, ApiError> {
        self.get(name)
            .ok_or_else(|| ApiError::invalid_query(format!("query parameter {name} is required")))
    }

    /// An integer parameter in `min..=max`, `default` when absent.
    pub fn bounded(&self, name: &str, default: u64, min: u64, max: u64) -> Result<u64, ApiError> {
        let Some(text) = self.get(name) else {
            return Ok(default);
        };
        let bounds = || format!("{name} must be an integer between {min} and {max}");
        let value: u64 = text.parse().map_err(|_| {
            ApiError::invalid_query(format!("{}, not {:?}", bounds(), truncate(text)))
        })?;
        if value < min || value > max {
            return Err(ApiError::invalid_query(format!(
                "{}, not {value}",
                bounds()
            )));
        }
        Ok(value)
    }
}

/// Echoes at most 64 characters of user input in a message.
fn truncate(s: &str) -> String {
    if s.chars().count() <= 64 {
        s.to_owned()
    } else {
        let mut t: String = s.chars().take(64).collect();
        t.push('…');
        t
    }
}

#[cfg(test)]
mod tests {
    use http::StatusCode;

    use super::*;

    #[test]
    fn reads_known_parameters() {
        let q = Query::parse(Some("client=c1&max=5"), &["client", "max", "waitMs"]).expect("ok");
        assert_eq!(q.required("client").expect("present"), "c1");
        assert_eq!(q.bounded("max", 10, 1, 1000).expect("ok"), 5);
        assert_eq!(q.bounded("waitMs", 1000, 0, 60_000).expect("default"), 1000);
    }

    #[test]
    fn percent_encoding_is_decoded() {
        let q = Query::parse(Some("topic=a%2Eb"), &["topic"]).expect("ok");
        assert_eq!(q.get("topic"), Some("a.b"));
    }

    #[test]
    fn refusals_name_the_parameter() {
        let e = Query::parse(Some("client=c&mx=5"), &["client", "max"])
            .err()
            .expect("unknown");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.code, "invalid-query");
        assert!(e.message.contains("\"mx\""), "{}", e.message);
        let e = Query::parse(Some("max=1&max=2"), &["max"])
            .err()
            .expect("repeated");
        assert!(e.message.contains("max"), "{}", e.message);
        let q =
            Query::parse(Some("max=0&waitMs=60001&n=abc"), &["max", "waitMs", "n"]).expect("ok");
        let e = q.bounded("max", 10, 1, 1000).expect_err("zero");
        assert!(
            e.message
                .contains("max must be an integer between 1 and 1000"),
            "{}",
            e.message
        );
        let e = q.bounded("waitMs", 0, 0, 60_000).expect_err("over");
        assert!(
            e.message.starts_with("waitMs") && e.message.contains("60001"),
            "{}",
            e.message
        );
        let e = q.bounded("n", 0, 0, 9).expect_err("not a number");
        assert!(e.message.contains("\"abc\""), "{}", e.message);
        let e = q.required("client").expect_err("missing");
        assert!(e.message.contains("client is required"), "{}", e.message);
        let e = Query::parse(Some("x=1"), &[]).err().expect("no params");
        assert!(e.message.contains("no query parameters"), "{}", e.message);
    }
}
