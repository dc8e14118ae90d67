//! Users over REST, as ThingsBoard serves them: `POST /api/user` (a tenant administrator or
//! a customer user; no mail is sent, whatever `sendActivationMail` says), `GET`/`DELETE
//! /api/user/{id}`, `GET /api/users`, `GET /api/customer/{id}/users`, the activation link
//! (`GET /api/user/{id}/activationLink`, `…/activationLinkInfo`), activation
//! (`POST /api/noauth/activate`: sets the password and logs in), `GET /api/auth/user` and
//! `POST /api/auth/changePassword`. Who may reach what: `gridlinks_platform::auth::users`.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use gridlinks_storage::{DocKind, DocRecord, WriteOp, WriteOutcome};
use gridlinks_thingsboard::model::{entity_id, NULL_UUID};
use gridlinks_types::Ts;
use serde::Deserialize;
use serde_json::{json, Value as J};
use uuid::Uuid;

use super::api::{auth_error, blocking, body_id, pair_json, parse_json, uuid};
use super::error::{ApiError, ApiResult};
use super::extract::{lenient_bool, Admin, Body, SysAdmin, User, Q};
use super::paging::{doc_page, DocListParams};
use gridlinks_platform::auth::users::{self as u, Authority, Caller, Entry};
use gridlinks_platform::auth::{Auth, AuthError};
use gridlinks_platform::entities::users;
use gridlinks_platform::Core;

type St = State<Arc<Core>>;

/// How long an activation link works, ms (ThingsBoard's default: 24 hours).
const ACTIVATION_TTL_MS: i64 = 24 * 3600 * 1000;
/// Password length bounds: ThingsBoard's default policy asks for 6; the upper bound keeps
/// hashing cheap.
const PASSWORD_LEN: std::ops::RangeInclusive<usize> = 6..=256;

/// ThingsBoard's `User` JSON of a stored user document.
fn render(st: &Core, d: &DocRecord) -> J {
    let field = |k: &str| d.doc.get(k).cloned().unwrap_or(J::Null);
    let customer = d.doc.get("customerId").and_then(J::as_str).unwrap_or(NULL_UUID);
    json!({
        "id": entity_id("USER", d.id),
        "createdTime": d.created_time,
        "tenantId": entity_id("TENANT", st.doc_tenant(d)),
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

/// The user JSON of `e`: the users of the configuration have no stored document.
async fn render_entry(st: &Core, e: &Entry) -> ApiResult<J> {
    if !e.configured {
        return Ok(render(st, &load(st, e.caller.user).await?));
    }
    let c = &e.caller;
    let tenant = match c.authority {
        Authority::SysAdmin => NULL_UUID.to_owned(),
        _ => c.tenant.to_string(),
    };
    Ok(json!({
        "id": entity_id("USER", c.user),
        "createdTime": 0,
        "tenantId": entity_id("TENANT", tenant),
        "customerId": entity_id("CUSTOMER", NULL_UUID),
        "email": c.email,
        "name": c.email,
        "authority": c.authority.as_str(),
        "firstName": null,
        "lastName": null,
        "phone": null,
        "additionalInfo": {},
    }))
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
/// new user has no password: it gets one through its activation link. A tenant
/// administrator creates its tenant's administrators and customer users; the system
/// administrator creates tenant administrators of any tenant (`tenantId`).
pub async fn save(
    User(me): User,
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
    if auth.users.is_configured_email(&email) {
        return Err(ApiError::bad_request("User with such email already exists!"));
    }
    let authority = match b.get("authority").and_then(J::as_str) {
        Some(a) => Authority::parse(a)
            .ok_or_else(|| ApiError::bad_request(format!("Invalid authority '{a}': TENANT_ADMIN or CUSTOMER_USER")))?,
        None => return Err(ApiError::bad_request("User authority should be specified!")),
    };
    let customer =
        body_id(&json!({"id": b.get("customerId")}), |s| uuid(s, "customer"))?.filter(|c| c.to_string() != NULL_UUID);
    // The tenant: the caller's own; the system administrator names it.
    let tenant = match me.authority {
        Authority::SysAdmin => {
            let t = body_id(&json!({"id": b.get("tenantId")}), |s| uuid(s, "tenant"))?
                .ok_or_else(|| ApiError::bad_request("A tenant administrator needs a tenantId"))?;
            super::tenants::load(&st, t).await?;
            t
        }
        _ => me.tenant,
    };
    let target = Caller { user: Uuid::nil(), email: email.clone(), authority, tenant, customer };
    if !me.may_manage(&target) {
        return Err(ApiError::forbidden());
    }
    match (authority, customer) {
        (Authority::CustomerUser, None) => {
            return Err(ApiError::bad_request("A customer user needs a customerId"));
        }
        (Authority::CustomerUser, Some(c)) => {
            let store = st.store.clone();
            let found = blocking(move || store.doc(DocKind::Customer, c)).await?;
            match found {
                Some(d) if st.doc_tenant(&d) == tenant => {}
                // Another tenant's customer is answered as one that does not exist.
                Some(_) | None => return Err(ApiError::not_found(format!("Customer with id [{c}] is not found"))),
            }
        }
        (_, Some(_)) => {
            return Err(ApiError::bad_request("A tenant administrator belongs to no customer"));
        }
        (_, None) => {}
    }
    let id = body_id(&b, |s| uuid(s, "user"))?;
    if let Some(id) = id {
        let old = users::managed(&auth, &me, id)?;
        if old.configured {
            return Err(ApiError::bad_request("The users of the configuration are changed in the configuration"));
        }
        if old.caller.authority != authority || old.caller.customer != customer || old.caller.tenant != tenant {
            return Err(ApiError::bad_request("A user's authority, tenant and customer cannot change"));
        }
        if id == me.user && old.caller.email != email {
            return Err(ApiError::bad_request("Change your own email by logging in as another administrator"));
        }
    }
    let doc = u::user_doc(&email, authority, tenant, customer, &b);
    let user = match st.writer.submit(WriteOp::SaveDoc { kind: DocKind::User, id, title: email, doc }).await? {
        WriteOutcome::Doc(d) => d,
        _ => return Err(ApiError::internal("unexpected write outcome")),
    };
    let uid = user.id;
    let store = st.store.clone();
    let credentials = match id {
        Some(_) => blocking(move || store.doc(DocKind::UserCredentials, uid)).await?,
        None => Some(write_credentials(&st, uid, u::credentials_doc(None, false, None, "")).await?),
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

/// `GET /api/user/{id}`: a user the caller manages, or itself.
pub async fn get(
    User(me): User,
    State(st): St,
    State(auth): State<Arc<Auth>>,
    Path(id): Path<String>,
) -> ApiResult<Json<J>> {
    let id = uuid(&id, "user")?;
    let e = match id == me.user {
        true => auth.users.by_id(id).ok_or_else(|| ApiError::unauthorized("Invalid JWT token"))?,
        false => users::managed(&auth, &me, id)?,
    };
    Ok(Json(render_entry(&st, &e).await?))
}

/// `GET /api/auth/user`: the caller.
pub async fn current(User(me): User, State(st): St, State(auth): State<Arc<Auth>>) -> ApiResult<Json<J>> {
    let e = auth.users.by_id(me.user).ok_or_else(|| ApiError::unauthorized("Invalid JWT token"))?;
    Ok(Json(render_entry(&st, &e).await?))
}

/// `DELETE /api/user/{id}`: its tokens and API keys stop working at once.
pub async fn delete(
    User(me): User,
    State(st): St,
    State(auth): State<Arc<Auth>>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    users::delete(&st, &auth, &me, uuid(&id, "user")?).await?;
    Ok(StatusCode::OK)
}

/// The stored users the caller manages that `keep` accepts, as a page.
async fn page_of_users(
    st: &Core,
    auth: &Auth,
    me: &Caller,
    p: DocListParams,
    keep: impl Fn(&Caller) -> bool,
) -> ApiResult<J> {
    let mine = |d: &DocRecord| auth.users.by_id(d.id).is_some_and(|e| me.may_manage(&e.caller) && keep(&e.caller));
    doc_page(st, DocKind::User, p, mine, |d| render(st, d)).await
}

/// `GET /api/users?pageSize=&page=`: the stored users the caller manages, by email (the
/// system administrator: tenant administrators; a tenant administrator: its tenant's).
pub async fn list(
    User(me): User,
    State(st): St,
    State(auth): State<Arc<Auth>>,
    Q(p): Q<DocListParams>,
) -> ApiResult<Json<J>> {
    if me.authority == Authority::CustomerUser {
        return Err(ApiError::forbidden());
    }
    Ok(Json(page_of_users(&st, &auth, &me, p, |_| true).await?))
}

/// `GET /api/customer/{customerId}/users?pageSize=&page=`.
pub async fn of_customer(
    Admin(me): Admin,
    State(st): St,
    State(auth): State<Arc<Auth>>,
    Path(c): Path<String>,
    Q(p): Q<DocListParams>,
) -> ApiResult<Json<J>> {
    let c = gridlinks_platform::entities::customers::get(&st, &me, uuid(&c, "customer")?).await?.id;
    Ok(Json(page_of_users(&st, &auth, &me, p, |u| u.customer == Some(c)).await?))
}

/// `GET /api/tenant/{tenantId}/users?pageSize=&page=` (the system administrator): the
/// tenant's administrators.
pub async fn of_tenant(
    SysAdmin(me): SysAdmin,
    State(st): St,
    State(auth): State<Arc<Auth>>,
    Path(t): Path<String>,
    Q(p): Q<DocListParams>,
) -> ApiResult<Json<J>> {
    let t = super::tenants::load(&st, uuid(&t, "tenant")?).await?.id;
    Ok(Json(page_of_users(&st, &auth, &me, p, |u| u.tenant == t).await?))
}

/// The link a user activates its account with: a fresh token each time (earlier links of
/// the user stop working), valid for 24 hours; only its SHA-256 is stored.
async fn activation_link(st: &Core, auth: &Auth, me: &Caller, headers: &HeaderMap, id: &str) -> ApiResult<String> {
    let id = uuid(id, "user")?;
    let user = users::managed(auth, me, id)?;
    if user.hash.is_some() {
        return Err(ApiError::bad_request("User is already activated!"));
    }
    let token: String = (0..2).map(|_| gridlinks_storage::generate_token()).collect();
    let expires = Ts::now().0 + ACTIVATION_TTL_MS;
    let c =
        write_credentials(st, id, u::credentials_doc(None, false, Some((&u::token_hash(&token), expires)), "")).await?;
    auth.users.put(&load(st, id).await?, Some(&c));
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("localhost");
    Ok(format!("http://{host}/api/noauth/activate?activateToken={token}"))
}

/// `GET /api/user/{id}/activationLink`: the link, as plain text.
pub async fn get_activation_link(
    User(me): User,
    State(st): St,
    State(auth): State<Arc<Auth>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<impl IntoResponse> {
    let link = activation_link(&st, &auth, &me, &headers, &id).await?;
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], link))
}

/// `GET /api/user/{id}/activationLinkInfo` (ThingsBoard 3.6+): `{"value": link, "ttlMs"}`.
pub async fn get_activation_link_info(
    User(me): User,
    State(st): St,
    State(auth): State<Arc<Auth>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> ApiResult<Json<J>> {
    let link = activation_link(&st, &auth, &me, &headers, &id).await?;
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

/// Sets `user`'s password; every login made before (with the old password) ends, even one
/// whose check of the old password is still under way. Returns a login.
async fn set_password(st: &Core, auth: &Auth, user: &Entry, password: String) -> ApiResult<J> {
    check_password(&password)?;
    let hash = auth.passwords.hash(password).await.map_err(auth_error)?;
    let doc = u::credentials_doc(Some(&hash), true, None, &u::new_stamp());
    let c = write_credentials(st, user.caller.user, doc).await?;
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

/// The query of an activation link.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActivationLink {
    /// The token `activation_link` made.
    activate_token: Option<String>,
}

/// `GET /api/noauth/activate?activateToken=`: where the link leads. As ThingsBoard sends it
/// to its password page, this sends it (303) to the console's, `/#/activate?activateToken=`,
/// where the user chooses a password; the page `POST`s it here and is logged in. The token
/// goes in the fragment, which the browser never sends on. A token with characters that
/// generated tokens do not have is dropped (the page then says the link has no token).
pub async fn activate_page(Q(link): Q<ActivationLink>) -> impl IntoResponse {
    let token = link
        .activate_token
        .filter(|t| t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'))
        .unwrap_or_default();
    (
        StatusCode::SEE_OTHER,
        [
            (header::LOCATION, format!("/#/activate?activateToken={token}")),
            (header::CACHE_CONTROL, "no-store".to_owned()),
        ],
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
