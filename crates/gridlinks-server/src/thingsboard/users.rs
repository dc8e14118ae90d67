//! Users over REST, as ThingsBoard serves them: `POST /api/user` (a tenant administrator or
//! a customer user; no mail is sent, whatever `sendActivationMail` says), `GET`/`DELETE
//! /api/user/{id}`, `GET /api/users`, `GET /api/customer/{id}/users`, the activation link
//! (`GET /api/user/{id}/activationLink`, `…/activationLinkInfo`), activation
//! (`POST /api/noauth/activate`: sets the password and logs in), `GET /api/auth/user` and
//! `POST /api/auth/changePassword`. Who may reach what: `crate::auth::users`.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use gridlinks_storage::{DocKind, DocRecord, WriteOp, WriteOutcome};
use gridlinks_thingsboard::model::{self, entity_id, NULL_UUID};
use gridlinks_types::Ts;
use serde::Deserialize;
use serde_json::{json, Value as J};
use uuid::Uuid;

use super::api::{auth_error, blocking, body_id, pair_json, parse_json};
use super::error::{ApiError, ApiResult};
use super::extract::{lenient_bool, Admin, Body, User, Q};
use super::paging::{doc_page, DocListParams};
use crate::app::Core;
use crate::auth::users::{self as u, Authority, Caller, Entry};
use crate::auth::{Auth, AuthError};

type St = State<Arc<Core>>;

/// How long an activation link works, ms (ThingsBoard's default: 24 hours).
const ACTIVATION_TTL_MS: i64 = 24 * 3600 * 1000;
/// Password length bounds: ThingsBoard's default policy asks for 6; the upper bound keeps
/// hashing cheap.
const PASSWORD_LEN: std::ops::RangeInclusive<usize> = 6..=256;

fn uuid(s: &str, what: &str) -> ApiResult<Uuid> {
    s.parse().map_err(|_| ApiError::bad_request(format!("Invalid {what} id: {s}")))
}

/// ThingsBoard's `User` JSON of a stored user document.
fn render(st: &Core, d: &DocRecord) -> J {
    let field = |k: &str| d.doc.get(k).cloned().unwrap_or(J::Null);
    let customer = d.doc.get("customerId").and_then(J::as_str).unwrap_or(NULL_UUID);
    json!({
        "id": entity_id("USER", d.id),
        "createdTime": d.created_time,
        "tenantId": entity_id("TENANT", st.tenant_id),
        "customerId": entity_id("CUSTOMER", customer),
        "email": d.title,
        "name": d.title,
        "authority": field("authority"),
        "firstName": field("firstName"),
        "lastName": field("lastName"),
        "phone": field("phone"),
        "additionalInfo": d.doc.get("additionalInfo").cloned().unwrap_or_else(|| json!({})),
    })
}

/// The user JSON of `c`: the configured administrator has no stored document.
async fn render_caller(st: &Core, c: &Caller, configured: bool) -> ApiResult<J> {
    if configured {
        return Ok(model::admin_user(&st.cfg.admin.user, st.tenant_id));
    }
    Ok(render(st, &load(st, c.user).await?))
}

async fn load(st: &Core, id: Uuid) -> ApiResult<DocRecord> {
    let store = st.store.clone();
    blocking(move || store.doc(DocKind::User, id))
        .await?
        .ok_or_else(|| ApiError::not_found(format!("User with id [{id}] is not found")))
}

fn valid_email(e: &str) -> bool {
    let mut parts = e.split('@');
    let (Some(local), Some(domain), None) = (parts.next(), parts.next(), parts.next()) else { return false };
    !local.is_empty()
        && !domain.is_empty()
        && e.len() <= 255
        && !e.chars().any(|c| c.is_whitespace() || c.is_control() || "<>()[],;:\"\\".contains(c))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SaveParams {
    #[serde(default, deserialize_with = "lenient_bool")]
    send_activation_mail: Option<bool>,
}

/// `POST /api/user[?sendActivationMail=]`: create, or update when the body has an id. A
/// new user has no password: it gets one through its activation link.
pub async fn save(
    Admin(me): Admin,
    State(st): St,
    State(auth): State<Arc<Auth>>,
    Q(p): Q<SaveParams>,
    Body(body): Body,
) -> ApiResult<Json<J>> {
    // GridLinks sends no mail: the activation link is for the administrator to hand over.
    let _ = p.send_activation_mail;
    let b: J = parse_json(&body)?;
    let email = b.get("email").and_then(J::as_str).unwrap_or_default().trim().to_lowercase();
    if !valid_email(&email) {
        return Err(ApiError::bad_request(format!("Invalid email address format '{email}'!")));
    }
    if auth.users.is_admin_email(&email) {
        return Err(ApiError::bad_request("User with such email already exists!"));
    }
    let authority = match b.get("authority").and_then(J::as_str) {
        Some(a) => Authority::parse(a).ok_or_else(|| {
            if a == "SYS_ADMIN" {
                ApiError::forbidden()
            } else {
                ApiError::bad_request(format!("Invalid authority '{a}': TENANT_ADMIN or CUSTOMER_USER"))
            }
        })?,
        None => return Err(ApiError::bad_request("User authority should be specified!")),
    };
    let customer =
        body_id(&json!({"id": b.get("customerId")}), |s| uuid(s, "customer"))?.filter(|c| c.to_string() != NULL_UUID);
    match (authority, customer) {
        (Authority::CustomerUser, None) => {
            return Err(ApiError::bad_request("A customer user needs a customerId"));
        }
        (Authority::CustomerUser, Some(c)) => {
            let store = st.store.clone();
            if blocking(move || store.doc(DocKind::Customer, c)).await?.is_none() {
                return Err(ApiError::not_found(format!("Customer with id [{c}] is not found")));
            }
        }
        (Authority::TenantAdmin, Some(_)) => {
            return Err(ApiError::bad_request("A tenant administrator belongs to no customer"));
        }
        (Authority::TenantAdmin, None) => {}
    }
    let id = body_id(&b, |s| uuid(s, "user"))?;
    if let Some(id) = id {
        let old = auth.users.by_id(id).filter(|e| !e.configured);
        let old = old.ok_or_else(|| ApiError::not_found(format!("User with id [{id}] is not found")))?;
        if old.caller.authority != authority || old.caller.customer != customer {
            return Err(ApiError::bad_request("A user's authority and customer cannot change"));
        }
        if id == me.user && old.caller.email != email {
            return Err(ApiError::bad_request("Change your own email by logging in as another administrator"));
        }
    }
    let doc = u::user_doc(&email, authority, customer, &b);
    let user = match st.writer.submit(WriteOp::SaveDoc { kind: DocKind::User, id, title: email, doc }).await? {
        WriteOutcome::Doc(d) => d,
        _ => return Err(ApiError::internal("unexpected write outcome")),
    };
    let uid = user.id;
    let store = st.store.clone();
    let credentials = match id {
        Some(_) => blocking(move || store.doc(DocKind::UserCredentials, uid)).await?,
        None => Some(write_credentials(&st, uid, u::credentials_doc(None, false, None, 0)).await?),
    };
    auth.users.put(&user, credentials.as_ref());
    Ok(Json(render(&st, &user)))
}

/// Writes `user`'s credentials document (same id as the user).
async fn write_credentials(st: &Core, user: Uuid, doc: J) -> ApiResult<DocRecord> {
    let store = st.store.clone();
    let exists = blocking(move || store.doc(DocKind::UserCredentials, user)).await?.is_some();
    let (kind, title) = (DocKind::UserCredentials, "credentials".to_owned());
    let op = match exists {
        true => WriteOp::SaveDoc { kind, id: Some(user), title, doc },
        false => WriteOp::InsertDoc { kind, id: user, title, doc },
    };
    match st.writer.submit(op).await? {
        WriteOutcome::Doc(d) => Ok(d),
        _ => Err(ApiError::internal("unexpected write outcome")),
    }
}

/// `GET /api/user/{id}`: any user for an administrator; a customer user only itself.
pub async fn get(
    User(me): User,
    State(st): St,
    State(auth): State<Arc<Auth>>,
    Path(id): Path<String>,
) -> ApiResult<Json<J>> {
    let id = uuid(&id, "user")?;
    if me.authority != Authority::TenantAdmin && id != me.user {
        return Err(ApiError::forbidden());
    }
    let e = auth.users.by_id(id).ok_or_else(|| ApiError::not_found(format!("User with id [{id}] is not found")))?;
    Ok(Json(render_caller(&st, &e.caller, e.configured).await?))
}

/// `GET /api/auth/user`: the caller.
pub async fn current(User(me): User, State(st): St, State(auth): State<Arc<Auth>>) -> ApiResult<Json<J>> {
    let configured = auth.users.by_id(me.user).is_some_and(|e| e.configured);
    Ok(Json(render_caller(&st, &me, configured).await?))
}

/// `DELETE /api/user/{id}`: its tokens and API keys stop working at once.
pub async fn delete(
    Admin(me): Admin,
    State(st): St,
    State(auth): State<Arc<Auth>>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let id = uuid(&id, "user")?;
    if id == me.user || auth.users.by_id(id).is_some_and(|e| e.configured) {
        return Err(ApiError::bad_request("The administrator of the configuration, or yourself, cannot be deleted"));
    }
    st.writer.submit(WriteOp::DeleteDoc(DocKind::User, id)).await?;
    auth.users.remove(id);
    auth.api_keys.remove_user(id);
    Ok(StatusCode::OK)
}

/// `GET /api/users?pageSize=&page=`: every stored user, by email.
pub async fn list(_: Admin, State(st): St, Q(p): Q<DocListParams>) -> ApiResult<Json<J>> {
    Ok(Json(doc_page(&st, DocKind::User, p, |_| true, |d| render(&st, d)).await?))
}

/// `GET /api/customer/{customerId}/users?pageSize=&page=`.
pub async fn of_customer(_: Admin, State(st): St, Path(c): Path<String>, Q(p): Q<DocListParams>) -> ApiResult<Json<J>> {
    let c = J::String(uuid(&c, "customer")?.to_string());
    Ok(Json(doc_page(&st, DocKind::User, p, |d| d.doc.get("customerId") == Some(&c), |d| render(&st, d)).await?))
}

/// The link a user activates its account with: a fresh token each time (earlier links of
/// the user stop working), valid for 24 hours; only its SHA-256 is stored.
async fn activation_link(st: &Core, auth: &Auth, headers: &HeaderMap, id: &str) -> ApiResult<String> {
    let id = uuid(id, "user")?;
    let user = auth.users.by_id(id).filter(|e| !e.configured);
    let user = user.ok_or_else(|| ApiError::not_found(format!("User with id [{id}] is not found")))?;
    if user.hash.is_some() {
        return Err(ApiError::bad_request("User is already activated!"));
    }
    let token: String = (0..2).map(|_| gridlinks_storage::generate_token()).collect();
    let expires = Ts::now().0 + ACTIVATION_TTL_MS;
    let c =
        write_credentials(st, id, u::credentials_doc(None, false, Some((&u::token_hash(&token), expires)), 0)).await?;
    auth.users.put(&load(st, id).await?, Some(&c));
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("localhost");
    Ok(format!("http://{host}/api/noauth/activate?activateToken={token}"))
}

/// `GET /api/user/{id}/activationLink`: the link, as plain text.
pub async fn get_activation_link(
    _: Admin,
    State(st): St,
    State(auth): State<Arc<Auth>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let link = activation_link(&st, &auth, &headers, &id).await?;
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], link))
}

/// `GET /api/user/{id}/activationLinkInfo` (ThingsBoard 3.6+): `{"value": link, "ttlMs"}`.
pub async fn get_activation_link_info(
    _: Admin,
    State(st): St,
    State(auth): State<Arc<Auth>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Json<J>> {
    let link = activation_link(&st, &auth, &headers, &id).await?;
    Ok(Json(json!({"value": link, "ttlMs": ACTIVATION_TTL_MS})))
}

fn check_password(p: &str) -> ApiResult<()> {
    if !PASSWORD_LEN.contains(&p.chars().count()) {
        return Err(ApiError::bad_request(format!(
            "Password must be {} to {} characters long",
            PASSWORD_LEN.start(),
            PASSWORD_LEN.end()
        )));
    }
    Ok(())
}

/// Sets `user`'s password; tokens issued before now stop working. Returns a login.
async fn set_password(st: &Core, auth: &Auth, user: &Entry, password: String) -> ApiResult<J> {
    check_password(&password)?;
    let hash = auth.passwords.hash(password).await.map_err(auth_error)?;
    let now = Ts::now().0 / 1000;
    let c = write_credentials(st, user.caller.user, u::credentials_doc(Some(&hash), true, None, now)).await?;
    auth.users.put(&load(st, user.caller.user).await?, Some(&c));
    let entry = auth.users.by_id(user.caller.user).ok_or_else(|| ApiError::internal("user vanished"))?;
    Ok(pair_json(&auth.start(&entry).await.map_err(auth_error)?))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ActivateRequest {
    activate_token: String,
    password: String,
}

/// `POST /api/noauth/activate[?sendActivationMail=]`: sets the password of the user whose
/// activation token it is, and logs it in (`JwtPair`).
pub async fn activate(
    State(st): St,
    State(auth): State<Arc<Auth>>,
    Q(_): Q<SaveParams>,
    Body(body): Body,
) -> ApiResult<Json<J>> {
    let r: ActivateRequest = parse_json(&body)?;
    let user = auth
        .users
        .activation(&r.activate_token, Ts::now().0)
        .ok_or_else(|| ApiError::not_found("Invalid or expired activation token"))?;
    Ok(Json(set_password(&st, &auth, &user, r.password).await?))
}

/// `GET /api/noauth/activate?activateToken=`: where the link leads. ThingsBoard's web page
/// is not built yet: the answer says how to activate.
pub async fn activate_page() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        "To activate this account, POST {\"activateToken\": \"<the token of this link>\", \"password\": \"<your new password>\"} to /api/noauth/activate\n",
    )
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ChangePassword {
    current_password: String,
    new_password: String,
}

/// `POST /api/auth/changePassword`: checked against the current password (throttled like
/// logins); the caller's other tokens stop working, and a new pair is returned.
pub async fn change_password(
    User(me): User,
    State(st): St,
    State(auth): State<Arc<Auth>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Body(body): Body,
) -> ApiResult<Json<J>> {
    let r: ChangePassword = parse_json(&body)?;
    let user = auth.users.by_id(me.user).ok_or_else(|| ApiError::unauthorized("Invalid JWT token"))?;
    if user.configured {
        return Err(ApiError::bad_request(
            "The administrator's password is set by admin.password in the configuration",
        ));
    }
    let name = user.caller.email.to_lowercase();
    auth.throttle.check(peer.ip(), &name).map_err(|w| auth_error(AuthError::Throttled(w)))?;
    if !auth.passwords.verify(r.current_password.as_bytes(), user.hash.as_deref()).await.map_err(auth_error)? {
        auth.throttle.failed(peer.ip(), &name);
        return Err(ApiError::bad_request("Current password doesn't match!"));
    }
    auth.throttle.succeeded(peer.ip(), &name);
    Ok(Json(set_password(&st, &auth, &user, r.new_password).await?))
}
