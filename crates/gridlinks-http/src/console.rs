//! The web console, embedded at build time (`build.rs`) and served at `/`: `index.html`
//! (never cached) and its hashed assets under `/assets/` (cached for good), gzip-encoded
//! for browsers that accept it.

use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// One file of the console.
pub struct File {
    /// Its path under `/`.
    pub path: &'static str,
    /// Its `Content-Type`.
    pub content_type: &'static str,
    /// Its bytes.
    pub bytes: &'static [u8],
    /// Its gzip copy, if built.
    pub gzip: Option<&'static [u8]>,
}

include!(concat!(env!("OUT_DIR"), "/console.rs"));

/// Scripts, styles and connections only from this origin; no framing.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; \
                   connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// Served when the binary was built without the console.
const NOT_BUILT: &str = "<!doctype html><html lang=\"en\"><title>GridLinks</title><main><h1>GridLinks</h1>\
<p>This binary was built without the web console. Build it with <code>make run</code> (or \
<code>cd console &amp;&amp; npm ci &amp;&amp; npm run build</code>, then rebuild the server). The REST, \
WebSocket, MQTT, CoAP and device APIs work without it.</p></main></html>";

fn serve(path: &str, headers: &HeaderMap) -> Response {
    let Some(&File { content_type, bytes, gzip, .. }) = FILES.iter().find(|f| f.path == path) else {
        if path == "/index.html" {
            return ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], NOT_BUILT).into_response();
        }
        return StatusCode::NOT_FOUND.into_response();
    };
    let gzip_ok = headers
        .get(header::ACCEPT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|e| e.trim().split(';').next() == Some("gzip")));
    let cache = if path.starts_with("/assets/") { "public, max-age=31536000, immutable" } else { "no-cache" };
    let mut res = match gzip {
        Some(gz) if gzip_ok => {
            let mut r = gz.into_response();
            r.headers_mut().insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
            r
        }
        _ => bytes.into_response(),
    };
    let h = res.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    h.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    res
}

/// `GET /`.
pub async fn index(headers: HeaderMap) -> Response {
    serve("/index.html", &headers)
}

/// `GET /assets/{file}`.
pub async fn asset(Path(file): Path<String>, headers: HeaderMap) -> Response {
    serve(&format!("/assets/{file}"), &headers)
}

/// Whether the console was built into this binary.
pub fn embedded() -> bool {
    !FILES.is_empty()
}
