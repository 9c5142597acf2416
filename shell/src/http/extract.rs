//! The extractors of the HTTP layer: names in the path, query parameters and JSON bodies.
//! Each refuses bad input with the API's own error answer (`{"error","message"}`, naming
//! the parameter or field), never with axum's plain-text rejections, and each runs in the
//! order the handler lists it — path, then query, then body — so the first problem found is
//! the one answered, as before the move to axum.

use std::marker::PhantomData;
use std::sync::Arc;

use axum::extract::{FromRequest, FromRequestParts, RawPathParams, Request};
use bytes::Bytes;
use http::request::Parts;
use serde::de::DeserializeOwned;
use unimesh_core::{ClientId, GroupName, NameError, TopicName};

use super::body::{parse_json, read_json_body};
use super::error::{code, ApiError};
use super::query::Query;
use super::App;

/// A name type of the core that a path segment can carry.
pub trait PathName: Sized {
    fn parse(s: &str) -> Result<Self, NameError>;
}

impl PathName for ClientId {
    fn parse(s: &str) -> Result<Self, NameError> {
        ClientId::new(s)
    }
}

impl PathName for GroupName {
    fn parse(s: &str) -> Result<Self, NameError> {
        GroupName::new(s)
    }
}

impl PathName for TopicName {
    fn parse(s: &str) -> Result<Self, NameError> {
        TopicName::new(s)
    }
}

/// The route's one path parameter (`{topic}`, `{group}` or `{client}`), percent-decoded and
/// checked: a bad one is 400 `invalid-name`.
pub struct Name<T>(pub T);

impl<S: Send + Sync, T: PathName> FromRequestParts<S> for Name<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let params = RawPathParams::from_request_parts(parts, state)
            .await
            .map_err(|e| {
                ApiError::bad_request(code::INVALID_NAME, format!("the path is not valid: {e}"))
            })?;
        let value = params.iter().next().map_or("", |(_, v)| v);
        Ok(Name(T::parse(value)?))
    }
}

/// The query parameters a route reads, as named by its `IntoParams` type (the same type
/// documents them). `NAMES` must list exactly the type's parameters; a unit test checks it.
pub trait QueryParams {
    const NAMES: &'static [&'static str];
}

/// A route with no query parameters.
pub struct NoParams;

impl QueryParams for NoParams {
    const NAMES: &'static [&'static str] = &[];
}

/// The query of a request, refused whole (400 `invalid-query`) when it has a parameter
/// that `T` does not name or one given twice. Values are read by the handler, which knows
/// their bounds.
pub struct Params<T>(pub Query, pub PhantomData<T>);

impl<S: Send + Sync, T: QueryParams> FromRequestParts<S> for Params<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, ApiError> {
        Ok(Params(
            Query::parse(parts.uri.query(), T::NAMES)?,
            PhantomData,
        ))
    }
}

/// A JSON request body: a JSON content type (or none), at most `limits.max_json_bytes`,
/// read within the body timeout, parsed into `T` (whose type refuses unknown fields).
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned> FromRequest<Arc<App>> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, app: &Arc<App>) -> Result<Self, ApiError> {
        let bytes = JsonBytes::from_request(req, app).await?.0;
        Ok(JsonBody(parse_json(&bytes)?))
    }
}

/// The bytes of a JSON request body, checked as [`JsonBody`] does but not parsed (for a
/// handler that parses them itself to name the field at fault).
pub struct JsonBytes(pub Bytes);

impl FromRequest<Arc<App>> for JsonBytes {
    type Rejection = ApiError;

    async fn from_request(req: Request, app: &Arc<App>) -> Result<Self, ApiError> {
        let (parts, body) = req.into_parts();
        Ok(JsonBytes(
            read_json_body(&app.limits, &parts.headers, body).await?,
        ))
    }
}
