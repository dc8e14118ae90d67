//! API keys over REST, as ThingsBoard 4.3 serves them: `POST /api/apiKey` (the value is
//! in this answer only), `GET /api/apiKeys/{userId}`, `PUT /api/apiKey/{id}/enabled/{value}`,
//! `PUT /api/apiKey/{id}/description`, `DELETE /api/apiKey/{id}`. A key acts as its user; a
//! user manages its own keys and those of the users it manages (a tenant administrator its
//! tenant's users'). What a key
//! is and how it is checked: `gridlinks_platform::auth::api_keys`.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use gridlinks_storage::{DocKind, DocRecord, WriteOp, WriteOutcome};
use gridlinks_thingsboard::model;
use gridlinks_types::Ts;
use serde::Deserialize;
use serde_json::Value as J;
use uuid::Uuid;

use super::api::{parse_json, uuid};
use super::error::{ApiError, ApiResult};
use super::extract::{Body, User, Q};
use super::paging::{doc_page, DocListParams};
use gridlinks_platform::auth::{api_keys, Auth};
use gridlinks_platform::entities::{api_keys as keys, users};
use gridlinks_platform::Core;

type St = State<Arc<Core>>;

fn info(st: &Core, d: &DocRecord) -> J {
    let field = |k: &str| d.doc.get(k);
    let key = model::ApiKey {
        id: d.id,
        created_time: d.created_time,
        user: field("userId").and_then(J::as_str).and_then(|u| u.parse().ok()).unwrap_or_default(),
        expiration_time: field("expirationTime").and_then(J::as_i64).unwrap_or(0),
        description: field("description").and_then(J::as_str).unwrap_or_default(),
        enabled: field("enabled").and_then(J::as_bool).unwrap_or(true),
    };
    model::api_key_info(&key, st.doc_tenant(d), Ts::now().0)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewKey {
    description: Option<String>,
    expiration_time: Option<i64>,
    enabled: Option<bool>,
    user_id: Option<model::Id>,
}

/// `POST /api/apiKey`: a new key for `userId` (the caller when absent); its value is in
/// this answer only.
pub async fn create(
    User(me): User,
    State(st): St,
    State(auth): State<Arc<Auth>>,
    Body(body): Body,
) -> ApiResult<Json<J>> {
    let b: NewKey = parse_json(&body)?;
    let user = match b.user_id {
        Some(u) => uuid(&u.id, "user")?,
        None => me.user,
    };
    let owner = users::keys_owner(&auth, &me, user)?;
    let expiration = b.expiration_time.unwrap_or(0);
    if expiration < 0 {
        return Err(ApiError::bad_request("expirationTime must be 0 (never) or a time in ms since epoch"));
    }
    let description = b.description.unwrap_or_default();
    // The id is part of the value, so the key is made for an id the writer then keeps.
    let id = Uuid::new_v4();
    let (value, hash) = api_keys::generate(id);
    let mut doc = api_keys::doc(&hash, &description, expiration, b.enabled.unwrap_or(true), user);
    st.set_doc_tenant(&mut doc, owner.tenant);
    let title = if description.trim().is_empty() { "API key".to_owned() } else { description };
    let d = match st.writer.submit(WriteOp::InsertDoc { kind: DocKind::ApiKey, id, title, doc }).await? {
        WriteOutcome::Doc(d) => d,
        _ => return Err(ApiError::internal("unexpected write outcome")),
    };
    auth.api_keys.put(&d);
    let mut out = info(&st, &d);
    if let Some(o) = out.as_object_mut() {
        o.insert("value".into(), value.into());
    }
    Ok(Json(out))
}

/// `GET /api/apiKeys/{userId}?pageSize=&page=`: the user's keys, without their values.
pub async fn list(
    User(me): User,
    State(st): St,
    State(auth): State<Arc<Auth>>,
    Path(user): Path<String>,
    Q(p): Q<DocListParams>,
) -> ApiResult<Json<J>> {
    let user = uuid(&user, "user")?;
    users::keys_owner(&auth, &me, user)?;
    Ok(Json(doc_page(&st, DocKind::ApiKey, p, |d| keys::owner(d) == Some(user), |d| info(&st, d)).await?))
}

/// `PUT /api/apiKey/{id}/enabled/{value}`.
pub async fn set_enabled(
    User(me): User,
    State(st): St,
    State(auth): State<Arc<Auth>>,
    Path((id, enabled)): Path<(String, bool)>,
) -> ApiResult<Json<J>> {
    let mut d = keys::get(&st, &auth, &me, uuid(&id, "API key")?).await?;
    if let Some(o) = d.doc.as_object_mut() {
        o.insert("enabled".into(), enabled.into());
    }
    let d = keys::store(&st, &auth, Some(d.id), d.title, d.doc).await?;
    Ok(Json(info(&st, &d)))
}

/// `PUT /api/apiKey/{id}/description` with the new description (a JSON string or plain text).
pub async fn set_description(
    User(me): User,
    State(st): St,
    State(auth): State<Arc<Auth>>,
    Path(id): Path<String>,
    Body(body): Body,
) -> ApiResult<Json<J>> {
    let text = match serde_json::from_slice::<J>(&body) {
        Ok(J::String(s)) => s,
        _ => String::from_utf8_lossy(&body).into_owned(),
    };
    let mut d = keys::get(&st, &auth, &me, uuid(&id, "API key")?).await?;
    if let Some(o) = d.doc.as_object_mut() {
        o.insert("description".into(), text.clone().into());
    }
    let title = if text.trim().is_empty() { "API key".to_owned() } else { text };
    let d = keys::store(&st, &auth, Some(d.id), title, d.doc).await?;
    Ok(Json(info(&st, &d)))
}

/// `DELETE /api/apiKey/{id}`: the key stops working at once.
pub async fn delete(
    User(me): User,
    State(st): St,
    State(auth): State<Arc<Auth>>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let id = keys::get(&st, &auth, &me, uuid(&id, "API key")?).await?.id;
    st.writer.submit(WriteOp::DeleteDoc(DocKind::ApiKey, id)).await?;
    auth.api_keys.remove(id);
    Ok(StatusCode::OK)
}
