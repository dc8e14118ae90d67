//! `/api/mqtt/clients`: MQTT application credentials over REST (the service is
//! `gridlinks_platform::broker_clients`). A credential belongs to the caller's tenant; user
//! names are unique across tenants.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use gridlinks_broker::topic::validate_filter;
use gridlinks_platform::broker_clients::{Credential, RuleSpec, MAX_FIELD, MAX_FILTERS};
use gridlinks_platform::Platform;
use gridlinks_types::Ts;
use serde::Deserialize;

use super::error::{ApiError, ApiResult};
use super::extract::{Admin, Body};
use gridlinks_platform::auth::Caller;

type St = State<Arc<Platform>>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SaveRequest {
    username: String,
    /// Required when creating; keeps the stored one when omitted on update.
    password: Option<String>,
    client_id: Option<String>,
    #[serde(default)]
    publish: Vec<String>,
    #[serde(default)]
    subscribe: Vec<String>,
    /// Ordered allow/deny rules, read before `publish` and `subscribe`.
    #[serde(default)]
    rules: Vec<RuleSpec>,
}

fn check_filters(what: &str, filters: &[String]) -> ApiResult<()> {
    if filters.len() > MAX_FILTERS {
        return Err(ApiError::bad_request(format!("{what}: at most {MAX_FILTERS} topic filters")));
    }
    for f in filters {
        if f.len() > MAX_FIELD || validate_filter(f).is_err() {
            return Err(ApiError::bad_request(format!("{what}: {f:?} is not a valid MQTT topic filter")));
        }
    }
    Ok(())
}

/// A credential of the caller's tenant (404 for another tenant's: user names are the
/// tenants' own business).
fn of_caller(st: &Platform, me: &Caller, username: &str) -> Option<Credential> {
    st.clients.get(username).filter(|c| c.tenant == st.core.stored_tenant(me.tenant))
}

/// `POST /api/mqtt/clients`: creates or updates a credential of the caller's tenant. Live
/// connections that use it are closed, so they reconnect under the new rules. User names
/// are unique across tenants: refusing another tenant's tells that it exists, so such
/// refusals are throttled (`gridlinks_platform::guards`).
pub async fn save(Admin(me): Admin, State(st): St, Body(body): Body) -> ApiResult<Json<serde_json::Value>> {
    let req: SaveRequest =
        serde_json::from_slice(&body).map_err(|e| ApiError::bad_request(format!("Invalid request body: {e}")))?;
    if req.username.is_empty() || req.username.len() > MAX_FIELD || req.username.chars().any(char::is_control) {
        return Err(ApiError::bad_request(format!(
            "username must be 1 to {MAX_FIELD} bytes, without control characters"
        )));
    }
    if req.client_id.as_ref().is_some_and(|c| c.is_empty() || c.len() > MAX_FIELD || c.chars().any(char::is_control)) {
        return Err(ApiError::bad_request(format!(
            "clientId must be 1 to {MAX_FIELD} bytes, without control characters, when given"
        )));
    }
    check_filters("publish", &req.publish)?;
    check_filters("subscribe", &req.subscribe)?;
    check_filters("rules", &req.rules.iter().map(|r| r.topic.clone()).collect::<Vec<_>>())?;
    let guards = &st.core.guards;
    guards.check_conflicts(&me).map_err(ApiError::credential_conflicts)?;
    let old = st.clients.get(&req.username);
    let tenant = st.core.stored_tenant(me.tenant);
    if old.as_ref().is_some_and(|o| o.tenant != tenant) {
        guards.conflict(&me);
        return Err(ApiError::bad_request("This MQTT user name is taken: choose another"));
    }
    let password_hash = match (req.password, &old) {
        (Some(pw), _) if !pw.is_empty() => {
            st.auth.passwords.hash(pw).await.map_err(crate::thingsboard::api::auth_error)?
        }
        (None, Some(old)) => old.password_hash.clone(),
        _ => return Err(ApiError::bad_request("password is required (and may not be empty) for a new credential")),
    };
    let cred = Credential {
        username: req.username,
        password_hash,
        client_id: req.client_id,
        publish: req.publish,
        subscribe: req.subscribe,
        rules: req.rules,
        created_time: old.map_or_else(|| Ts::now().0, |o| o.created_time),
        tenant,
    };
    let view = cred.view();
    st.clients.save(&st.core.writer, cred).await.map_err(|e| guards.note(&me, e))?;
    Ok(Json(view))
}

/// `GET /api/mqtt/clients`: the caller's tenant's credentials, by user name.
pub async fn list(Admin(me): Admin, State(st): St) -> ApiResult<Json<serde_json::Value>> {
    let all = st.clients.of_tenant(st.core.stored_tenant(me.tenant))?;
    Ok(Json(all.iter().map(Credential::view).collect()))
}

/// `GET /api/mqtt/clients/{username}`.
pub async fn get(Admin(me): Admin, State(st): St, Path(username): Path<String>) -> ApiResult<Json<serde_json::Value>> {
    of_caller(&st, &me, &username).map(|c| Json(c.view())).ok_or_else(|| not_found(&username))
}

/// `DELETE /api/mqtt/clients/{username}`: the credential stops working and live
/// connections that use it are closed.
pub async fn delete(Admin(me): Admin, State(st): St, Path(username): Path<String>) -> ApiResult<StatusCode> {
    if of_caller(&st, &me, &username).is_none() {
        return Err(not_found(&username));
    }
    st.clients.delete(&st.core.writer, vec![username]).await?;
    Ok(StatusCode::OK)
}

fn not_found(username: &str) -> ApiError {
    ApiError::not_found(format!("MQTT client credential [{username}] is not found"))
}
