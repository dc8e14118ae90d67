//! The notification center as ThingsBoard's REST API serves it (`NotificationTarget`,
//! `NotificationTemplate`, `NotificationRule` controllers, the requests as the delivery
//! log, and a user's inbox of `WEB` notifications). A webhook target's `secret` is
//! write-only: it is never sent back.

use std::sync::Arc;

use axum::extract::{Path, RawQuery, State};
use axum::Json;
use gridlinks_platform::notify;
use gridlinks_platform::{Core, Platform};
use gridlinks_storage::{DocKind, DocRecord};
use gridlinks_thingsboard::model::entity_id;
use serde_json::{json, Value as J};

use super::api::{body_id, parse_json, uuid};
use super::error::{ApiError, ApiResult};
use super::extract::{Body, User};
use super::paging::{descending, page_link, page_of};

type St = State<Arc<Core>>;

/// A kind by its path segment, with the entity type its ids carry.
fn kind(segment: &str) -> ApiResult<(DocKind, &'static str)> {
    Ok(match segment {
        "target" | "targets" => (DocKind::NotificationTarget, "NOTIFICATION_TARGET"),
        "template" | "templates" => (DocKind::NotificationTemplate, "NOTIFICATION_TEMPLATE"),
        "rule" | "rules" => (DocKind::NotificationRule, "NOTIFICATION_RULE"),
        "request" | "requests" => (DocKind::NotificationRequest, "NOTIFICATION_REQUEST"),
        other => return Err(ApiError::not_found(format!("No such API path: /api/notification/{other}"))),
    })
}

/// A document as ThingsBoard shows it: its id, time, tenant and name, then its fields.
fn render(st: &Core, d: &DocRecord, entity_type: &str) -> J {
    let mut out = serde_json::Map::new();
    out.insert("id".into(), entity_id(entity_type, d.id));
    out.insert("createdTime".into(), d.created_time.into());
    out.insert("tenantId".into(), entity_id("TENANT", st.doc_tenant(d)));
    out.insert("name".into(), d.title.clone().into());
    if let Some(o) = d.doc.as_object() {
        for (k, v) in o.iter().filter(|(k, _)| k.as_str() != "tenantId") {
            out.insert(k.clone(), v.clone());
        }
    }
    if let Some(c) = out.get_mut("configuration").and_then(J::as_object_mut) {
        if c.remove("secret").is_some() {
            c.insert("secretSet".into(), true.into());
        }
    }
    J::Object(out)
}

/// `POST /api/notification/{target|template|rule}`: create, or update the body's id.
pub async fn save(
    User(me): User,
    State(p): State<Arc<Platform>>,
    Path(segment): Path<String>,
    Body(body): Body,
) -> ApiResult<Json<J>> {
    let (kind, et) = kind(&segment)?;
    if kind == DocKind::NotificationRequest {
        return Err(ApiError::bad_request(
            "notification requests are made by rules: GridLinks sends no ad-hoc requests",
        ));
    }
    let doc: J = parse_json(&body)?;
    let id = body_id(&doc, |s| uuid(s, et))?;
    let name = doc.get("name").and_then(J::as_str).unwrap_or_default().to_owned();
    let d = notify::save(&p, &me, kind, id, name, doc).await?;
    Ok(Json(render(&p.core, &d, et)))
}

/// `GET /api/notification/{kind}/{id}`.
pub async fn get(User(me): User, State(st): St, Path((segment, id)): Path<(String, String)>) -> ApiResult<Json<J>> {
    let (kind, et) = kind(&segment)?;
    let d = notify::get(&st, &me, kind, uuid(&id, et)?).await?;
    Ok(Json(render(&st, &d, et)))
}

/// `DELETE /api/notification/{kind}/{id}`.
pub async fn delete(User(me): User, State(st): St, Path((segment, id)): Path<(String, String)>) -> ApiResult<()> {
    let (kind, et) = kind(&segment)?;
    if kind == DocKind::NotificationRequest {
        let d = notify::get(&st, &me, kind, uuid(&id, et)?).await?;
        st.writer.submit(gridlinks_storage::WriteOp::DeleteDoc(kind, d.id)).await?;
        return Ok(());
    }
    notify::delete(&st, &me, kind, uuid(&id, et)?).await?;
    Ok(())
}

/// Paging parameters of the lists (`pageSize`, `page`, `textSearch`, `sortProperty`,
/// `sortOrder`, and the inbox's `unreadOnly`, `deliveryMethod`).
struct ListParams {
    link: (usize, usize),
    text: Option<String>,
    by_name: bool,
    desc: bool,
    unread_only: bool,
}

fn params(st: &Core, q: Option<&str>) -> ApiResult<ListParams> {
    let (mut size, mut page, mut text, mut sort, mut order, mut unread) = (None, 0, None, None, None, false);
    for (k, v) in form_urlencoded::parse(q.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "pageSize" => {
                size = Some(v.parse::<i64>().map_err(|_| ApiError::bad_request(format!("Invalid pageSize: {v}")))?)
            }
            "page" => page = v.parse::<i64>().map_err(|_| ApiError::bad_request(format!("Invalid page: {v}")))?,
            "textSearch" => text = Some(v.to_lowercase()).filter(|t| !t.is_empty()),
            "sortProperty" => sort = Some(v.into_owned()),
            "sortOrder" => order = Some(v.into_owned()),
            "unreadOnly" => unread = v.eq_ignore_ascii_case("true"),
            // The inbox is WEB; the types filter is answered by the whole list.
            "deliveryMethod" | "notificationTypes" => {}
            other => {
                return Err(ApiError::bad_request(format!("Invalid query parameters: unknown parameter '{other}'")))
            }
        }
    }
    let link = page_link(st, size.ok_or_else(|| ApiError::bad_request("pageSize is required"))?, page)?;
    let by_name = match sort.as_deref() {
        None | Some("createdTime") => false,
        Some("name") | Some("title") => true,
        Some(other) => return Err(ApiError::bad_request(format!("Unsupported sort property: {other}"))),
    };
    let desc = match sort {
        Some(_) => descending(order.as_deref())?,
        None => true,
    };
    Ok(ListParams { link, text, by_name, desc, unread_only: unread })
}

fn page(st: &Core, mut all: Vec<DocRecord>, p: &ListParams, et: &str) -> J {
    if let Some(t) = &p.text {
        all.retain(|d| d.title.to_lowercase().contains(t));
    }
    match p.by_name {
        true => all.sort_by(|a, b| a.title.cmp(&b.title)),
        false => all.sort_by_key(|d| (d.created_time, d.id)),
    }
    if p.desc {
        all.reverse();
    }
    page_of(&all, p.link, |d| render(st, d, et))
}

/// `GET /api/notification/{targets|templates|rules|requests}`.
pub async fn list(
    User(me): User,
    State(st): St,
    Path(segment): Path<String>,
    RawQuery(q): RawQuery,
) -> ApiResult<Json<J>> {
    let (kind, et) = kind(&segment)?;
    let p = params(&st, q.as_deref())?;
    let all = notify::list(&st, &me, kind).await?;
    Ok(Json(page(&st, all, &p, et)))
}

/// `GET /api/notification/deliveryMethods`.
pub async fn delivery_methods(User(_me): User) -> Json<J> {
    Json(json!(notify::METHODS))
}

/// An inbox notification as ThingsBoard shows it.
fn notification(d: &DocRecord) -> J {
    let mut j = json!({"id": entity_id("NOTIFICATION", d.id), "createdTime": d.created_time});
    if let (Some(o), Some(doc)) = (j.as_object_mut(), d.doc.as_object()) {
        for (k, v) in doc.iter().filter(|(k, _)| k.as_str() != "tenantId") {
            o.insert(k.clone(), v.clone());
        }
        for k in ["requestId", "recipientId"] {
            let (et, id) = (if k == "requestId" { "NOTIFICATION_REQUEST" } else { "USER" }, doc.get(k).cloned());
            o.insert(k.into(), id.map_or(J::Null, |id| json!({"entityType": et, "id": id})));
        }
    }
    j
}

/// `GET /api/notifications`: the caller's inbox, newest first.
pub async fn inbox(User(me): User, State(st): St, RawQuery(q): RawQuery) -> ApiResult<Json<J>> {
    let p = params(&st, q.as_deref())?;
    let mut all = notify::inbox(&st, &me, p.unread_only).await?;
    if let Some(t) = &p.text {
        all.retain(|n| n.doc.to_string().to_lowercase().contains(t));
    }
    Ok(Json(page_of(&all, p.link, notification)))
}

/// `GET /api/notifications/unread/count`.
pub async fn unread(User(me): User, State(st): St) -> ApiResult<Json<J>> {
    Ok(Json(J::from(notify::inbox(&st, &me, true).await?.len())))
}

/// `PUT /api/notification/{id}/read`.
pub async fn read(User(me): User, State(st): St, Path((id, what)): Path<(String, String)>) -> ApiResult<()> {
    if what != "read" {
        return Err(ApiError::not_found(format!("No such API path: /api/notification/{id}/{what}")));
    }
    notify::mark_read(&st, &me, Some(uuid(&id, "notification")?)).await?;
    Ok(())
}

/// `PUT /api/notifications/read`.
pub async fn read_all(User(me): User, State(st): St) -> ApiResult<()> {
    notify::mark_read(&st, &me, None).await?;
    Ok(())
}

/// `DELETE /api/notification/{id}`.
pub async fn delete_notification(User(me): User, State(st): St, Path(id): Path<String>) -> ApiResult<()> {
    notify::delete_notification(&st, &me, uuid(&id, "notification")?).await?;
    Ok(())
}
