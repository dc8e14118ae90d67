//! ThingsBoard's error body, `{"status","message","errorCode","timestamp"}`, and the
//! `errorCode` values GridLinks sends. HTTP framing (status line, headers) is the
//! server's.

use gridlinks_types::Ts;
use serde_json::{json, Value as J};

/// ThingsBoard's `errorCode` values used here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum ErrorCode {
    /// GENERAL.
    General = 2,
    /// AUTHENTICATION.
    Authentication = 10,
    /// JWT_TOKEN_EXPIRED.
    JwtExpired = 11,
    /// PERMISSION_DENIED.
    PermissionDenied = 20,
    /// BAD_REQUEST_PARAMS.
    BadRequestParams = 31,
    /// ITEM_NOT_FOUND.
    ItemNotFound = 32,
    /// TOO_MANY_REQUESTS.
    TooManyRequests = 33,
    /// ENTITIES_LIMIT_EXCEEDED.
    EntitiesLimitExceeded = 41,
}

impl ErrorCode {
    /// The number sent as `errorCode`.
    pub fn as_u16(self) -> u16 {
        self as u16
    }
}

/// The error body for HTTP status `status`.
pub fn body(status: u16, code: ErrorCode, message: &str, timestamp: Ts) -> J {
    json!({
        "status": status,
        "message": message,
        "errorCode": code.as_u16(),
        "timestamp": timestamp.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thingsboard_error_body() {
        assert_eq!(
            body(401, ErrorCode::JwtExpired, "Token has expired", Ts(9)),
            json!({"status": 401, "message": "Token has expired", "errorCode": 11, "timestamp": 9})
        );
        assert_eq!(ErrorCode::BadRequestParams.as_u16(), 31);
    }
}
