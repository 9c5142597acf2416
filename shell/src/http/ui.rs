//! The web console's files (issue 22), served by the admin listener at `/ui`: one page, its
//! script and its style, hand-written and embedded in the binary (no build step, nothing
//! fetched from elsewhere). They hold no data: the page reads everything from the admin
//! API — the live feed `/admin/events` and the views and levers it already has — so with
//! `[auth]` it needs an identity with the admin right like any admin client (the page asks
//! for the token and keeps it in the tab's `sessionStorage`).
//!
//! Served with a content security policy that lets the page load only these files and talk
//! only to its own origin, and that no other site may frame it.

use axum::extract::Path;
use axum::response::{IntoResponse, Response};
use http::header::{
    CACHE_CONTROL, CONTENT_SECURITY_POLICY, CONTENT_TYPE, REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS,
    X_FRAME_OPTIONS,
};

use super::error::ApiError;

const INDEX: &str = include_str!("../../ui/index.html");
const SCRIPT: &str = include_str!("../../ui/console.js");
const STYLE: &str = include_str!("../../ui/console.css");

/// Only this origin's own files and requests; no inline script or style; no framing.
const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                      connect-src 'self'; img-src 'self' data:; base-uri 'none'; \
                      form-action 'none'; frame-ancestors 'none'";

/// `GET /ui`: the console's page.
pub(super) async fn index() -> Response {
    file("text/html; charset=utf-8", INDEX)
}

/// `GET /ui/{asset}`: the page's script or style.
pub(super) async fn asset(Path(name): Path<String>) -> Response {
    match name.as_str() {
        "console.js" => file("text/javascript; charset=utf-8", SCRIPT),
        "console.css" => file("text/css; charset=utf-8", STYLE),
        _ => ApiError::not_found(&format!("/ui/{name}")).into_response(),
    }
}

fn file(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (CONTENT_TYPE, content_type),
            // The binary is the version: a new one may bring new files.
            (CACHE_CONTROL, "no-cache"),
            (X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (X_FRAME_OPTIONS, "DENY"),
            (REFERRER_POLICY, "no-referrer"),
            (CONTENT_SECURITY_POLICY, POLICY),
        ],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the page loads only what is served here, from here: its script and style by
    /// the paths `asset` answers, nothing inline (the policy forbids it), no other origin.
    #[test]
    fn the_page_references_only_its_own_files() {
        assert!(INDEX.contains(r#"src="/ui/console.js""#), "{INDEX}");
        assert!(INDEX.contains(r#"href="/ui/console.css""#), "{INDEX}");
        for page in [INDEX, SCRIPT, STYLE] {
            assert!(!page.contains("http://") && !page.contains("https://"));
            assert!(!page.contains("<script>") && !page.contains("style=\""));
        }
        assert!(
            !SCRIPT.contains("setInterval"),
            "no polling loop in the page"
        );
    }
}
