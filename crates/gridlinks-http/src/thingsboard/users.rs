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
use gridlinks_storage::{DocKind, DocRecord};
use gridlinks_thingsboard::model::{entity_id, NULL_UUID};
use serde::Deserialize;
use serde_json::{json, Value as J};
use uuid::Uuid;

use super::api::{blocking, body_id, pair_json, parse_json, uuid};
use super::error::{ApiError, ApiResult};
use super::extract::{lenient_bool, Admin, Body, SysAdmin, User, Q};
use super::paging::{doc_page, DocListParams};
use gridlinks_platform::auth::users::{Authority, Caller, Entry};
use gridlinks_platform::auth::Auth;
use gridlinks_platform::entities::users;
use gridlinks_platform::Core;

type St = State<Arc<Core>>;

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
pub(crate) async fn render_entry(st: &Core, e: &Entry) -> ApiResult<J> {
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
    let authority = match b.get("authority").and_then(J::as_str) {
        Some(a) => Authority::parse(a)
            .ok_or_else(|| ApiError::bad_request(format!("Invalid authority '{a}': TENANT_ADMIN or CUSTOMER_USER")))?,
        None => return Err(ApiError::bad_request("User authority should be specified!")),
    };
    let customer =
        body_id(&json!({"id": b.get("customerId")}), |s| uuid(s, "customer"))?.filter(|c| c.to_string() != NULL_UUID);
    let tenant = body_id(&json!({"id": b.get("tenantId")}), |s| uuid(s, "tenant"))?;
    let id = body_id(&b, |s| uuid(s, "user"))?;
    let user = users::save(&st, &auth, &me, users::NewUser { id, email, authority, tenant, customer, body: b }).await?;
    Ok(Json(render(&st, &user)))
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
    let token = users::activation_token(st, auth, me, uuid(id, "user")?).await?;
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
    Ok(Json(json!({"value": link, "ttlMs": users::ACTIVATION_TTL_MS})))
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
    Ok(Json(pair_json(&users::activate(&st, &auth, &r.activate_token, r.password).await?)))
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
    let pair = users::change_password(&st, &auth, &me, peer.ip(), &r.current_password, r.new_password).await?;
    Ok(Json(pair_json(&pair)))
}
