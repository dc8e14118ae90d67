//! ThingsBoard's CoAP device API resources, from a request's method, Uri-Path segments and
//! Uri-Query options (as a CoAP codec hands them out): what the request asks for, or why it
//! cannot be served.

use crate::attributes::AttributeRequest;

/// A CoAP request method.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    /// GET.
    Get,
    /// POST.
    Post,
    /// PUT, DELETE, FETCH, …: no device API resource takes them.
    Other,
}

/// What a device asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resource<'a> {
    /// `POST /api/v1/{token}/telemetry`.
    PostTelemetry(&'a str),
    /// `POST /api/v1/{token}/attributes` (client scope).
    PostAttributes(&'a str),
    /// `GET /api/v1/{token}/attributes?clientKeys=&sharedKeys=`.
    GetAttributes(&'a str, AttributeRequest),
}

/// Why a request names no resource.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// No such resource (4.04).
    #[error("no such resource: use /api/v1/{{token}}/telemetry or /attributes")]
    NotFound,
    /// The resource exists but not with this method (4.05).
    #[error("telemetry: POST; attributes: POST or GET")]
    MethodNotAllowed,
    /// A query parameter the resource does not take (4.00).
    #[error("unknown query parameter {0:?}: clientKeys and sharedKeys are accepted")]
    BadQuery(String),
}

/// The resource `method` on `path` (Uri-Path segments) with `query` (Uri-Query options) names.
pub fn route<'a>(method: Method, path: &[&'a str], query: &[&str]) -> Result<Resource<'a>, RouteError> {
    let ["api", "v1", token, resource] = path else { return Err(RouteError::NotFound) };
    match (method, *resource) {
        (Method::Post, "telemetry") => Ok(Resource::PostTelemetry(token)),
        (Method::Post, "attributes") => Ok(Resource::PostAttributes(token)),
        (Method::Get, "attributes") => {
            let (mut client, mut shared) = (None, None);
            for q in query {
                match q.split_once('=') {
                    Some(("clientKeys", v)) => client = Some(v),
                    Some(("sharedKeys", v)) => shared = Some(v),
                    _ => return Err(RouteError::BadQuery((*q).to_owned())),
                }
            }
            Ok(Resource::GetAttributes(token, AttributeRequest::from_key_lists(client, shared)))
        }
        (_, "telemetry" | "attributes") => Err(RouteError::MethodNotAllowed),
        _ => Err(RouteError::NotFound),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        let p = |s: &'static str| s.split('/').filter(|x| !x.is_empty()).collect::<Vec<_>>();
        assert_eq!(route(Method::Post, &p("/api/v1/T/telemetry"), &[]), Ok(Resource::PostTelemetry("T")));
        assert_eq!(route(Method::Post, &p("/api/v1/T/attributes"), &[]), Ok(Resource::PostAttributes("T")));
        let get = route(Method::Get, &p("/api/v1/T/attributes"), &["clientKeys=a,b", "sharedKeys=c"]);
        assert_eq!(get, Ok(Resource::GetAttributes("T", AttributeRequest::from_key_lists(Some("a,b"), Some("c")))));
        assert_eq!(route(Method::Get, &p("/api/v1/T/telemetry"), &[]), Err(RouteError::MethodNotAllowed));
        assert_eq!(route(Method::Other, &p("/api/v1/T/attributes"), &[]), Err(RouteError::MethodNotAllowed));
        assert_eq!(route(Method::Post, &p("/api/v1/T/rpc"), &[]), Err(RouteError::NotFound));
        assert_eq!(route(Method::Post, &p("/api/v2/T/telemetry"), &[]), Err(RouteError::NotFound));
        assert_eq!(route(Method::Post, &p("/api/v1/T/telemetry/x"), &[]), Err(RouteError::NotFound));
        assert_eq!(route(Method::Get, &p("/api/v1/T/attributes"), &["x=1"]), Err(RouteError::BadQuery("x=1".into())));
    }
}
